"""A small GPT: a character-level transformer language model, trained with DDP on Ray.

An ordinary LightningModule and LightningDataModule, as in nanoGPT: nothing here knows about Ray
or the orchestrator. The text is Python's own documentation, which ships with every Python
(`pydoc_data.topics`, about 460,000 characters of English and code), so the job needs no download.

    orchestrator run jobs/gpt.yaml                                   # 2 CPU workers, about 80 s
    orchestrator run jobs/gpt.yaml --set lightning.trainer.max_epochs=8   # train on: resumes from the last checkpoint
    orchestrator run jobs/gpt.yaml --set name=gpt-gpu --set scaling.use_gpu=true --set scaling.num_workers=8 \
        --set lightning.trainer.precision=bf16-mixed \
        --set lightning.model.init_args.n_layer=12 --set lightning.model.init_args.n_embd=768 \
        --set lightning.model.init_args.n_head=12
    orchestrator run jobs/gpt.yaml --set lightning.trainer.strategy=fsdp   # sharded (FSDP2), tied weights kept
    orchestrator run jobs/gpt.yaml --set lightning.trainer.strategy=deepspeed_stage_3   # DeepSpeed ZeRO-3
    ray job submit --working-dir . -- orchestrator run jobs/gpt.yaml # on a cluster

Sizes are init_args only: the same code runs the 0.8M-parameter model of jobs/gpt.yaml on a
laptop's CPU and a GPT-2-small-sized one on GPUs (block_size is set for the model and the data
alike).
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


def corpus() -> str:
    """Python's documentation topics, in a fixed order (the same text wherever the Python version is the same)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


class CharTokenizer:
    """One token per character of the corpus (vocabulary: its distinct characters, sorted)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, tokens: torch.Tensor) -> str:
        return "".join(self.chars[int(t)] for t in tokens)


class Windows(Dataset):
    """Non-overlapping windows of `block_size` tokens: input, and the same shifted by one."""

    def __init__(self, tokens: torch.Tensor, block_size: int):
        self.tokens, self.block_size = tokens, block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, i: int):
        start = i * self.block_size
        chunk = self.tokens[start:start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class TextData(pl.LightningDataModule):
    def __init__(self, block_size: int = 64, batch_size: int = 32, val_fraction: float = 0.1):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str):
        text = corpus()
        self.tokenizer = CharTokenizer(text)
        tokens = self.tokenizer.encode(text)
        split = int(len(tokens) * (1 - self.hparams.val_fraction))
        self.train_set = Windows(tokens[:split], self.hparams.block_size)
        self.val_set = Windows(tokens[split:], self.hparams.block_size)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(pl.LightningModule):
    def __init__(self, vocab_size: int = 128, block_size: int = 64, n_layer: int = 2, n_head: int = 4,
                 n_embd: int = 64, dropout: float = 0.0, lr: float = 3e-3, warmup_steps: int = 20,
                 max_lr_steps: int = 400):
        super().__init__()
        self.save_hyperparameters()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head, dropout) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """GPT-2's initialisation: small weights, so the first predictions are near uniform."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def on_fit_start(self):
        tokenizer = getattr(self.trainer.datamodule, "tokenizer", None)
        if tokenizer is not None and tokenizer.vocab_size > self.hparams.vocab_size:
            raise ValueError(f"the text has {tokenizer.vocab_size} distinct characters but the model's vocab_size "
                             f"is {self.hparams.vocab_size}. Fix: set lightning.model.init_args.vocab_size to at "
                             f"least {tokenizer.vocab_size}.")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        return self.head(self.ln_f(self.blocks(x)))

    def _loss(self, batch) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.1)
        warmup, total = self.hparams.warmup_steps, self.hparams.max_lr_steps

        def schedule(step: int) -> float:  # linear warm-up, then cosine decay to 10%
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, new_tokens: int, temperature: float = 0.8) -> torch.Tensor:
        for _ in range(new_tokens):
            logits = self(tokens[:, -self.hparams.block_size:])[:, -1] / temperature
            tokens = torch.cat([tokens, torch.multinomial(F.softmax(logits, dim=-1), 1)], dim=1)
        return tokens
