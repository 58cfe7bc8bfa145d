"""Plain Lightning, the baseline of bench/local_start.py: the quickstart's model and data
(jobs/digits.py) under `torchrun --nproc_per_node 2`, Trainer(devices=2, strategy="ddp"), the
quickstart's 8 epochs with a checkpoint at each epoch's end, then the test set, as the
quickstart's run does. Rank 0 writes time.time() to $FIRST_STEP_FILE after its first step
(TimedClassifier, which the orchestrator's side trains too)."""

import os
import sys
import time

import lightning.pytorch as pl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs.digits import DigitsClassifier, DigitsData


class TimedClassifier(DigitsClassifier):
    """The quickstart's model; rank 0 notes the time of its first optimizer step (both sides run it)."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.global_step == 1 and self.global_rank == 0 and os.environ.get("FIRST_STEP_FILE"):
            with open(os.environ["FIRST_STEP_FILE"], "w") as f:
                f.write(str(time.time()))


if __name__ == "__main__":
    pl.seed_everything(0)
    # The work the quickstart's run does: Lightning's own checkpoint at each epoch's end (its
    # default, in a folder of its own) and the test set evaluated once trained (jobs/quickstart.yaml's
    # `test`); no logger, no progress bar, as the orchestrator's ranks have none by default.
    root = os.environ.get("PLAIN_ROOT_DIR", os.path.join(os.path.dirname(os.environ.get("FIRST_STEP_FILE", ".")),
                                                         "plain-lightning"))
    trainer = pl.Trainer(max_epochs=8, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=root)
    data = DigitsData(batch_size=32)
    model = TimedClassifier(hidden=128, lr=0.002)
    trainer.fit(model, data)
    trainer.test(model, data, verbose=False)
    if trainer.global_rank == 0 and os.environ.get("FIRST_STEP_FILE"):
        with open(os.environ["FIRST_STEP_FILE"] + ".end", "w") as f:
            f.write(str(time.time()))
