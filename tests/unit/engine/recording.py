"""A training callback for tests: every batch the loop trains on (``on_batch``) and every rollback."""


class Recorder:
    def __init__(self):
        self.batches, self.rollbacks = [], []

    @property
    def rows(self) -> list:
        return [batch.rows.copy() for batch in self.batches]

    @property
    def keys(self) -> list[tuple[str, ...]]:
        return [tuple(batch.keys) for batch in self.batches]

    def on_batch(self, *, step, batch):
        self.batches.append(batch)

    def on_rollback(self, **event):
        self.rollbacks.append(event)

    def on_step(self, **_):
        pass

    def on_epoch_end(self, **_):
        pass

    def on_checkpoint(self, **_):
        pass
