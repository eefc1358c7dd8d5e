"""Knowledge-base multiple choice, ``kb-mc`` (tag ``k``): the MedReason stand-in.

Multi-hop reasoning over facts that only a model trained on this world knows.

World
    ``world_seed`` fixes a hidden knowledge base over ``N_ENTITIES = 20`` entities (the letters
    ``a``..``t``) and three relations (the digits ``1``, ``2``, ``3``). Each relation is a random
    permutation of the entities, so the world holds 20 * 3 = 60 facts of the form ``q -1-> x``.

Question
    A start entity, a relation path of 2 to 4 hops, and four candidate end entities, each printed
    with its label A-D. Prompt ``kq123?bAgBmCrD:`` reads: from ``q`` follow relation 1, then 2,
    then 3; is the end ``b`` (A), ``g`` (B), ``m`` (C) or ``r`` (D)? The reference completion
    ``q1x2m3r#rD`` names every hop (so every fact used is visible to a student that is distilled
    on teacher traces), then the final answer: the end entity and its letter. The score checks
    the letter: the final answer is ``<letter>`` or ``<entity><letter>``.

    Labels follow the entity's group (format version 2): A is always one of ``a-e``, B one of
    ``f-j``, C one of ``k-o``, D one of ``p-t``, so the options are the answer plus one
    distractor from each other group. Why: with options in a random order, tiny teachers learned
    every hop of the trace (100% of traces right after 300 steps) but stayed at chance on the
    letter for 600-2,000 steps, because the letter needed the end entity's *position* in the list
    (or an induction step when options were printed beside their labels), a skill that says
    nothing about knowledge. With group labels the letter is a fixed function of the end entity,
    and the task measures what it is meant to: whether the model knows the facts.

Splits
    The key is start + path (``q123``): 20 * (3**2 + 3**3 + 3**4) = 2,340 distinct questions,
    split by ``split_of(key)`` (about 230 test questions). Test questions are new combinations,
    but their single-hop facts are shared with training questions (each fact is used by dozens of
    keys). The key does not depend on ``world_seed``, so every world has the same splits.

Chance level and why the student base is weak
    The answer's group is uniform (relations are permutations) and each group holds exactly one
    option, so nothing in the format points at the answer: without this world's facts the
    expected accuracy is 25%. The student base is pretrained on the same format with another
    ``world_seed``: it knows how to follow a path and label an entity, but its chain ends at an
    entity of this world's answer group about one time in four: about 25%. A teacher trained on
    this world's traces can approach 100%.
"""
from __future__ import annotations

import random
from functools import cache
from itertools import product

from .base import ANSWER_MARK, PROMPT_END, SPLITS, Problem, Split, Task, final_answer, split_of

ENTITIES = "abcdefghijklmnopqrst"
RELATIONS = "123"
HOPS = (2, 3, 4)
LETTERS = "ABCD"
GROUP_SIZE = len(ENTITIES) // len(LETTERS)  # a-e -> A, f-j -> B, k-o -> C, p-t -> D
N_ENTITIES = len(ENTITIES)


@cache
def _keys_by_split() -> dict[str, tuple[str, ...]]:
    """All keys (start + path) grouped by split; world independent."""
    groups: dict[str, list[str]] = {s: [] for s in SPLITS}
    for start in ENTITIES:
        for hops in HOPS:
            for path in product(RELATIONS, repeat=hops):
                key = start + "".join(path)
                groups[split_of(key)].append(key)
    return {s: tuple(keys) for s, keys in groups.items()}


def label_of(entity: str) -> str:
    """The letter of an entity's group: a-e -> A, f-j -> B, k-o -> C, p-t -> D."""
    return LETTERS[ENTITIES.index(entity) // GROUP_SIZE]


def group_of(label: str) -> str:
    """The entities labelled ``label``."""
    i = LETTERS.index(label)
    return ENTITIES[i * GROUP_SIZE:(i + 1) * GROUP_SIZE]


def _check_int(value: object, name: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


class KBTask(Task):
    """2-3 hop relation paths over a hidden 20-entity knowledge base, four options A-D."""

    name = "kb-mc"
    tag = "k"
    format_version = 2  # options labelled by entity group; final answer "<entity><letter>"
    # trace: start + (relation, entity) per hop; then "#", the end entity and its letter
    max_new_tokens = 1 + 2 * max(HOPS) + 3

    def __init__(self, world_seed: int = 0) -> None:
        self.world_seed = _check_int(world_seed, "world_seed")
        rng = random.Random(f"kb-world:{world_seed}")
        self._maps: dict[str, dict[str, str]] = {}
        for relation in RELATIONS:
            image = list(ENTITIES)
            rng.shuffle(image)
            self._maps[relation] = dict(zip(ENTITIES, image))

    # ----- the world -------------------------------------------------------------------------
    def world_facts(self) -> list[str]:
        """The 60 facts of this world, e.g. ``"q -1-> x"`` (relation 1 maps q to x)."""
        return [f"{e} -{r}-> {self._maps[r][e]}" for r in RELATIONS for e in ENTITIES]

    def chain(self, start: str, path: str) -> list[str]:
        """Entities visited from ``start`` along ``path``: length len(path) + 1."""
        if len(start) != 1 or start not in ENTITIES:
            raise ValueError(f"start must be one of {ENTITIES!r}, got {start!r}")
        if not path or any(r not in RELATIONS for r in path):
            raise ValueError(f"path must be a non-empty string over {RELATIONS!r}, got {path!r}")
        visited = [start]
        for relation in path:
            visited.append(self._maps[relation][visited[-1]])
        return visited

    def trace(self, start: str, path: str) -> str:
        """The hops as text: ``q1x2m3z`` = q -1-> x -2-> m -3-> z."""
        visited = self.chain(start, path)
        return visited[0] + "".join(r + e for r, e in zip(path, visited[1:]))

    # ----- problems --------------------------------------------------------------------------
    def problem_for_key(self, key: str) -> Problem:
        """The problem of ``key`` = start + path (distractors seeded by world + key)."""
        if len(key) < 1 + min(HOPS) or len(key) > 1 + max(HOPS):
            raise ValueError(f"key must be a start entity and a {HOPS} hop path, got {key!r}")
        start, path = key[0], key[1:]
        answer = self.chain(start, path)[-1]
        rng = random.Random(f"kb-options:{self.world_seed}:{key}")
        letter = label_of(answer)
        options = [answer if label == letter else rng.choice(group_of(label)) for label in LETTERS]
        listing = "".join(o + label for o, label in zip(options, LETTERS))
        prompt = f"{self.tag}{start}{path}?{listing}{PROMPT_END}"
        data = {"world_seed": self.world_seed, "start": start, "path": path,
                "options": "".join(options), "answer_entity": answer, "answer": letter}
        return Problem(task=self.name, key=key, prompt=prompt, data=data)

    def capacity(self, split: Split) -> int:
        return len(_keys_by_split()[split])

    def problems(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        """``count`` distinct problems of ``split``, in an order fixed by ``seed``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        _check_int(count, "count", 0)
        _check_int(seed, "seed")
        keys = list(_keys_by_split()[split])
        if count > len(keys):
            raise ValueError(
                f"count={count} exceeds the {len(keys)} {split} problems of {self.name}"
            )
        random.Random(f"{self.name}:{split}:{seed}").shuffle(keys)
        return [self.problem_for_key(k) for k in keys[:count]]

    @staticmethod
    def parse_prompt(prompt: str) -> tuple[str, str, str]:
        """(start, path, options) of a ``kb-mc`` prompt such as ``kq123?fAmBqCzD:``."""
        body = prompt[1:-1] if len(prompt) >= 2 else ""
        head, _, listing = body.partition("?")
        options = listing[0::2]
        ok = (prompt[:1] == KBTask.tag and prompt.endswith(PROMPT_END) and len(listing) == 8
              and listing[1::2] == LETTERS and all(o in ENTITIES and label_of(o) == label
                                                   for o, label in zip(options, LETTERS))
              and len(head) - 1 in HOPS and head[:1] in ENTITIES
              and all(r in RELATIONS for r in head[1:]) and all(o in ENTITIES for o in options))
        if not ok:
            raise ValueError(f"prompt is not a {KBTask.name} prompt: {prompt!r}")
        return head[0], head[1:], options

    def solve(self, prompt: str) -> str:
        """The completion this world's facts give for ``prompt`` (possibly another world's):
        the trace, then the end entity and its group's letter (right about one time in four on
        another world's questions)."""
        start, path, _ = self.parse_prompt(prompt)
        end = self.chain(start, path)[-1]
        return self.trace(start, path) + ANSWER_MARK + end + label_of(end)

    def reference(self, problem: Problem, rng: random.Random) -> str:
        """Trace + "#" + end entity + letter under this world (``rng`` unused: deterministic)."""
        self._check_problem(problem)
        return self.solve(problem.prompt)

    def score(self, problem: Problem, completion: str) -> float:
        """1.0 when the text after the last "#" is the right letter, alone or after one entity
        (``D`` or ``zD``; the entity is the model's restatement and is not judged), else 0.0."""
        self._check_problem(problem)
        ans = final_answer(completion)
        if ans is None or not 1 <= len(ans) <= 2 or (len(ans) == 2 and ans[0] not in ENTITIES):
            return 0.0
        return 1.0 if ans[-1] == problem.data["answer"] else 0.0

    def _check_problem(self, problem: Problem) -> None:
        if problem.task != self.name:
            raise ValueError(f"problem.task must be {self.name!r}, got {problem.task!r}")
