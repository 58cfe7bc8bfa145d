"""The GPT job's pieces, in-process with plain Lightning (its Ray run is measured in the README)."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch

from jobs.gpt import GPT, CharTokenizer, TextData, Windows, corpus


def test_the_text_ships_with_python_and_round_trips_through_the_tokenizer():
    text = corpus()
    assert len(text) > 100_000
    tokenizer = CharTokenizer(text)
    sample = text[:500]
    assert tokenizer.decode(tokenizer.encode(sample)) == sample
    assert tokenizer.vocab_size <= GPT().hparams.vocab_size, "the default vocab_size holds every character"


def test_a_window_predicts_its_input_shifted_by_one():
    windows = Windows(torch.arange(100), block_size=8)
    assert len(windows) == 12
    x, y = windows[3]
    assert x.tolist() == list(range(24, 32)) and y.tolist() == list(range(25, 33))


def test_a_few_steps_of_plain_lightning_bring_the_loss_below_uniform_guessing():
    torch.manual_seed(0)
    data = TextData(block_size=32, batch_size=16)
    model = GPT(block_size=32, n_layer=1, n_embd=32, lr=1e-2, warmup_steps=2, max_lr_steps=40)
    trainer = pl.Trainer(max_steps=40, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=4)
    trainer.fit(model, datamodule=data)
    loss = trainer.validate(model, datamodule=data, verbose=False)[0]["val_loss"]
    assert loss < 0.8 * math.log(data.tokenizer.vocab_size), loss
