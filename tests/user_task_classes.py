"""Task classes a user script would define (module `obj_tasks`, written to a temporary folder by the
`user_tasks` fixture of conftest.py): objects whose constructor values config.yaml can or cannot hold."""

USER_TASKS = '''
from dataclasses import dataclass, field
from typing import Any, Callable

from esft.tasks import Task


def contains(completion, example):
    return float(example["answer"] in completion)


@dataclass
class Weighted(Task):
    """A task whose scorer and weights are Python objects."""
    name: str = "weighted"
    count: int = 6
    scorer: Callable = contains
    weights: Any = None
    tags: tuple = ("a",)

    def _load(self, split):
        return [{"q": f"Say {i}.", "answer": str(i)} for i in range(self.count)]

    def prompt(self, example):
        return [{"role": "user", "content": example["q"]}]

    def score(self, completion, example):
        return float(self.scorer(completion, example))


@dataclass
class Tupled(Weighted):
    """Tuple fields that a default alone does not show: a default_factory's, an optional one's."""
    ids: tuple = field(default_factory=tuple)
    extra: tuple[int, ...] | None = None


class Plain:
    """Not a dataclass: its constructor's arguments are unknown once it is built."""
    def __init__(self, rows=4):
        self.rows = [{"q": f"Say {i}.", "answer": str(i)} for i in range(rows)]
    def load(self, split):
        return self.rows
    def prompt(self, example):
        return example["q"]
    def score(self, completion, example):
        return float(example["answer"] in completion)


class NoArgs(Plain):
    def __init__(self):
        super().__init__(3)
'''
