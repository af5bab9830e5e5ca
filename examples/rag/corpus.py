"""The RAG task's world: fictional people, companies, cities and countries, one fact per passage.

Every name is made up from syllables, so no model can know a fact it has not read: each question
can only be answered by searching the passages. A world of the default size has about 2,400
passages:

- ``{person} was born in {city}.`` and ``{person} works for {company}.`` for each person,
- ``{company} is based in {city}.`` for each company,
- ``{city} is a city in {country}.`` for each city.

Questions take two or three hops, each hop one search for ``{entity} {relation word}``:

- "In which country was {person} born?": person -> birth city -> its country;
- "In which city is the company {person} works for based?": person -> company -> its city;
- "In which country is the company {person} works for based?": person -> company -> city -> country.

The splits hold disjoint people, so a held-out question's first hop is about someone training
never saw.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TypedDict

__all__ = ["Hop", "Task", "World", "make_splits", "make_world"]

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m")


class Hop(TypedDict):
    """One search of a solution: its query and the entity the top passage names."""

    query: str
    found: str


class Task(TypedDict):
    """One question, its gold answer, and the searches that answer it."""

    id: str
    question: str
    answer: str
    hops: list[Hop]


@dataclass
class World:
    """The passages and the facts behind them."""

    passages: list[str] = field(default_factory=list)
    born_in: dict[str, str] = field(default_factory=dict)
    works_for: dict[str, str] = field(default_factory=dict)
    based_in: dict[str, str] = field(default_factory=dict)
    city_in: dict[str, str] = field(default_factory=dict)

    def questions(self, person: str) -> list[Task]:
        """The three questions about ``person``."""
        city, company = self.born_in[person], self.works_for[person]
        base = self.based_in[company]
        born = Hop(query=f"{person} born", found=city)
        works = Hop(query=f"{person} works", found=company)
        based = Hop(query=f"{company} based", found=base)
        return [
            Task(
                id=f"{person}-born-country",
                question=f"In which country was {person} born?",
                answer=self.city_in[city],
                hops=[born, Hop(query=f"{city} city", found=self.city_in[city])],
            ),
            Task(
                id=f"{person}-company-city",
                question=f"In which city is the company {person} works for based?",
                answer=base,
                hops=[works, based],
            ),
            Task(
                id=f"{person}-company-country",
                question=f"In which country is the company {person} works for based?",
                answer=self.city_in[base],
                hops=[works, based, Hop(query=f"{base} city", found=self.city_in[base])],
            ),
        ]


def _names(rng: random.Random, count: int, taken: set[str], syllables: tuple[int, int]) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(*syllables))]
        name = ("".join(parts) + rng.choice(_CODAS)).capitalize()
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def make_world(
    seed: int = 0, people: int = 1000, companies: int = 150, cities: int = 200, countries: int = 24
) -> World:
    """A world of made-up names and facts, the same for the same arguments.

    >>> world = make_world(0, people=10, companies=3, cities=4, countries=2)
    >>> len(world.passages), world.passages[0].endswith(".")
    (27, True)
    """
    rng = random.Random(f"rag-world-{seed}")
    taken: set[str] = set()
    country_names = _names(rng, countries, taken, (2, 3))
    city_names = _names(rng, cities, taken, (2, 3))
    company_names = _names(rng, companies, taken, (2, 3))
    person_names = _names(rng, people, taken, (2, 3))
    world = World()
    for city in city_names:
        world.city_in[city] = rng.choice(country_names)
        world.passages.append(f"{city} is a city in {world.city_in[city]}.")
    for company in company_names:
        world.based_in[company] = rng.choice(city_names)
        world.passages.append(f"{company} is based in {world.based_in[company]}.")
    for person in person_names:
        world.born_in[person] = rng.choice(city_names)
        world.works_for[person] = rng.choice(company_names)
        world.passages.append(f"{person} was born in {world.born_in[person]}.")
        world.passages.append(f"{person} works for {world.works_for[person]}.")
    rng.shuffle(world.passages)
    return world


def make_splits(
    world: World, seed: int = 0, sizes: tuple[int, int, int] = (2000, 64, 128)
) -> dict[str, list[Task]]:
    """Train, validation and test questions about disjoint people, in that order of ``sizes``.

    >>> world = make_world(0, people=60, companies=5, cities=8, countries=3)
    >>> splits = make_splits(world, 0, (30, 6, 6))
    >>> {name: len(tasks) for name, tasks in splits.items()}
    {'train': 30, 'val': 6, 'test': 6}
    >>> people = [{task["id"].split("-")[0] for task in splits[name]} for name in splits]
    >>> people[0] & people[1], people[0] & people[2], people[1] & people[2]
    (set(), set(), set())
    """
    rng = random.Random(f"rag-splits-{seed}")
    people = sorted(world.born_in)
    rng.shuffle(people)
    # Held-out people first, each with one of their questions at random; training people give
    # all three of theirs.
    val_people, test_people = people[: sizes[1]], people[sizes[1] : sizes[1] + sizes[2]]
    train_people = people[sizes[1] + sizes[2] :]
    if len(train_people) * 3 < sizes[0]:
        raise ValueError(f"a world of {len(people)} people cannot hold splits of {sizes}")
    train = [task for person in train_people for task in world.questions(person)]
    rng.shuffle(train)
    return {
        "train": train[: sizes[0]],
        "val": [rng.choice(world.questions(person)) for person in val_people],
        "test": [rng.choice(world.questions(person)) for person in test_people],
    }
