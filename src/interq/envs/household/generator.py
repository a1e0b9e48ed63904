"""Procedural generator of household rooms and tasks (built in, no alfworld needed).

How a task is made (all draws from ``random.Random`` seeded by a SHA-256 of the inputs, so the same
``(split, index, seed)`` gives the same world on every machine and Python version):

1. **Task type**: ``TASK_TYPES[index % 6]`` — every split is balanced over ALFWorld's six types.
2. **Room kind**: drawn among the kinds ALFRED allows for that type (``ROOMS_FOR_TASK``, from
   ALFRED's ``GOALS_VALID``: heating and cooling only in kitchens, lamps only in living rooms and
   bedrooms, ...).
3. **Scene** (room layout): drawn among the split's scenes of that kind. Scenes use ALFRED's
   FloorPlan numbering and split: scenes 7-30, 207-230, 307-330, 407-430 are *seen* (``train`` and
   ``valid_seen``), scenes 1-6, 201-206, 301-306, 401-406 are *unseen* (``valid_unseen``). A scene fixes
   the receptacles (types and counts), the object types that may appear, the lamp and where it stands:
   ``scene_layout(scene)`` depends on the scene number only. So ``valid_unseen`` tasks happen in rooms
   (receptacle sets, object inventories, lamp placements) never seen in ``train``.
4. **Targets**: an object type with the property the task needs, a goal receptacle type that can
   hold it (``CAN_CONTAIN``; not the appliance itself), ALFWorld's goal template (one of two).
5. **Placement**: 1-3 instances of the target type (2-3 for ``pick_two_obj``) and a dozen-odd
   distractors, each in a receptacle that can hold it; targets never start in a goal-type receptacle,
   so no task is solved at the start. Openable receptacles start closed.

``train`` and ``valid_seen`` share scenes but never a task: their seeds differ by split name.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass

from .world import (
    APPLIANCE,
    CAN_CONTAIN,
    CLEANABLE,
    COOLABLE,
    GOAL_TEMPLATES,
    HEATABLE,
    LAMP_HOSTS,
    OPENABLE_TYPES,
    TASK_TYPES,
    GoalSpec,
    HouseholdWorld,
    ObjectSpec,
    ReceptacleSpec,
    can_contain,
    object_properties,
)

SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")

# Default number of tasks per split (ALFWorld's official counts).
DEFAULT_SPLIT_SIZES: dict[str, int] = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}

ROOM_SCENES: dict[str, range] = {
    "kitchen": range(1, 31),
    "livingroom": range(201, 231),
    "bedroom": range(301, 331),
    "bathroom": range(401, 431),
}


def is_unseen_scene(scene: int) -> bool:
    """ALFRED's test scenes: the first six of every room kind."""
    return scene % 100 <= 6 if scene >= 100 else scene <= 6


def split_scenes(split: str, room: str) -> list[int]:
    _check_split(split)
    unseen = split == "valid_unseen"
    return [s for s in ROOM_SCENES[room] if is_unseen_scene(s) == unseen]


ROOMS_FOR_TASK: dict[str, tuple[str, ...]] = {
    "pick_and_place": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "pick_two_obj": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "look_at_obj_in_light": ("livingroom", "bedroom"),
    "pick_clean_then_place": ("kitchen", "bathroom"),
    "pick_heat_then_place": ("kitchen",),
    "pick_cool_then_place": ("kitchen",),
}

# (type, min count, max count) per room kind.
_ROOM_RECEPTACLES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "kitchen": (("cabinet", 3, 12), ("drawer", 1, 8), ("countertop", 1, 3), ("fridge", 1, 1),
                ("microwave", 1, 1), ("sinkbasin", 1, 1), ("stoveburner", 2, 4), ("toaster", 1, 1),
                ("coffeemachine", 1, 1), ("garbagecan", 1, 1), ("diningtable", 0, 2), ("shelf", 0, 3),
                ("sidetable", 0, 1)),
    "livingroom": (("sofa", 1, 1), ("armchair", 0, 2), ("coffeetable", 1, 2), ("sidetable", 0, 3),
                   ("tvstand", 0, 1), ("drawer", 0, 5), ("cabinet", 0, 4), ("shelf", 0, 6), ("dresser", 0, 1),
                   ("garbagecan", 1, 1), ("diningtable", 0, 1), ("ottoman", 0, 1)),
    "bedroom": (("bed", 1, 1), ("desk", 0, 1), ("dresser", 0, 1), ("sidetable", 1, 2), ("drawer", 2, 8),
                ("shelf", 0, 6), ("garbagecan", 1, 1), ("laundryhamper", 0, 1), ("safe", 0, 1),
                ("armchair", 0, 1)),
    "bathroom": (("toilet", 1, 1), ("sinkbasin", 1, 2), ("bathtubbasin", 0, 1), ("cabinet", 2, 4),
                 ("countertop", 1, 1), ("drawer", 0, 4), ("garbagecan", 1, 1), ("handtowelholder", 0, 1),
                 ("towelholder", 0, 1), ("toiletpaperhanger", 1, 1), ("shelf", 0, 3), ("cart", 0, 1)),
}

_ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    "kitchen": ("apple", "bowl", "bread", "butterknife", "cup", "dishsponge", "egg", "fork", "kettle", "knife",
                "ladle", "lettuce", "mug", "pan", "peppershaker", "plate", "pot", "potato", "saltshaker",
                "soapbottle", "spatula", "spoon", "tomato", "winebottle", "creditcard", "cellphone"),
    "livingroom": ("book", "box", "cellphone", "creditcard", "keychain", "laptop", "newspaper", "pillow",
                   "remotecontrol", "statue", "vase", "watch", "tissuebox", "wateringcan", "bowl", "plate",
                   "candle"),
    "bedroom": ("alarmclock", "baseballbat", "basketball", "book", "bowl", "box", "cd", "cellphone",
                "creditcard", "keychain", "laptop", "mug", "pen", "pencil", "pillow", "tennisracket", "vase",
                "watch", "cloth", "statue"),
    "bathroom": ("candle", "cloth", "dishsponge", "handtowel", "plunger", "soapbar", "soapbottle",
                 "spraybottle", "tissuebox", "toiletpaper", "towel"),
}

_ROOM_LAMPS: dict[str, tuple[str, ...]] = {"livingroom": ("floorlamp", "desklamp"), "bedroom": ("desklamp",)}

# Objects look_at_obj_in_light uses (ALFRED's examine-in-light targets).
LOOK_OBJECTS: frozenset[str] = frozenset({"alarmclock", "book", "bowl", "box", "cd", "cellphone", "creditcard",
                                          "cup", "keychain", "laptop", "mug", "newspaper", "pen", "pencil",
                                          "pillow", "plate", "remotecontrol", "statue", "vase", "watch",
                                          "tissuebox", "basketball", "baseballbat", "tennisracket", "candle"})


@dataclass(frozen=True)
class SceneLayout:
    """What a scene number fixes: receptacles (type, count), object inventory, lamp and its host."""

    scene: int
    room: str
    receptacle_counts: tuple[tuple[str, int], ...]
    object_types: tuple[str, ...]
    lamp_type: str | None
    lamp_host: str | None      # receptacle name the lamp stands in/on


def room_of_scene(scene: int) -> str:
    for room, scenes in ROOM_SCENES.items():
        if scene in scenes:
            return room
    raise ValueError(f"scene must be in 1-30, 201-230, 301-330 or 401-430; got {scene!r}")


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


SIZES: tuple[str, ...] = ("full", "small")
SMALL_MAX_PER_TYPE = 2


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}; got {size!r}")


@functools.lru_cache(maxsize=None)
def scene_layout(scene: int, size: str = "full") -> SceneLayout:
    """The fixed layout of a scene (deterministic in the scene number and size).

    ``size="small"`` derives a compact room from the full one: only the receptacle types every room
    of that kind has, at most two of each (shorter admissible lists and plans, for CPU-scale training).
    """
    _check_size(size)
    full = _full_layout(scene)
    if size == "full":
        return full
    required = {t for t, lo, _ in _ROOM_RECEPTACLES[full.room] if lo > 0}
    counts = tuple((t, min(n, SMALL_MAX_PER_TYPE)) for t, n in full.receptacle_counts if t in required)
    rtypes = {t for t, _ in counts}
    lamp_type, lamp_host = full.lamp_type, None
    if lamp_type is not None:
        ht, _, hn = full.lamp_host.rpartition(" ")
        if ht in rtypes:
            lamp_host = f"{ht} {min(int(hn), dict(counts)[ht])}"
        else:
            hosts = sorted(t for t in rtypes if t in LAMP_HOSTS)
            lamp_host = f"{hosts[0]} 1" if hosts else None
            lamp_type = lamp_type if hosts else None
    object_types = tuple(t for t in full.object_types if any(can_contain(r, t) for r in rtypes))
    return SceneLayout(scene, full.room, counts, object_types, lamp_type, lamp_host)


@functools.lru_cache(maxsize=None)
def _full_layout(scene: int) -> SceneLayout:
    room = room_of_scene(scene)
    rng = _rng("household-scene", scene)
    counts: list[tuple[str, int]] = []
    for rtype, lo, hi in _ROOM_RECEPTACLES[room]:
        n = rng.randint(lo, hi)
        if n:
            counts.append((rtype, n))
    pool = list(_ROOM_OBJECTS[room])
    rng.shuffle(pool)
    keep = max(6, int(round(len(pool) * rng.uniform(0.6, 0.85))))
    rtypes = {t for t, _ in counts}
    object_types = tuple(sorted(t for t in pool[:keep] if any(can_contain(r, t) for r in rtypes)))
    lamp_type = lamp_host = None
    if room in _ROOM_LAMPS:
        hosts = sorted((t, n) for t, n in counts if t in LAMP_HOSTS)
        if not hosts:  # make room for a lamp
            counts.append(("sidetable", 1))
            hosts = [("sidetable", 1)]
        lamp_type = rng.choice(_ROOM_LAMPS[room])
        ht, hn = rng.choice(hosts)
        lamp_host = f"{ht} {rng.randint(1, hn)}"
    counts.sort()
    return SceneLayout(scene, room, tuple(counts), object_types, lamp_type, lamp_host)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")


def task_id_for(split: str, index: int) -> str:
    return f"{split}-{index:05d}"


def parse_task_id(task_id: str) -> tuple[str, int]:
    """Inverse of :func:`task_id_for`; raises ValueError naming the accepted form."""
    split, sep, num = str(task_id).rpartition("-")
    if not sep or split not in SPLITS or not num.isdigit():
        raise ValueError(f"household task_id must look like '<split>-<index>' with split in {list(SPLITS)} "
                         f"(e.g. 'train-00042'); got {task_id!r}")
    return split, int(num)


def _has_property(task_type: str, otype: str) -> bool:
    if task_type == "pick_heat_then_place":
        return otype in HEATABLE
    if task_type == "pick_cool_then_place":
        return otype in COOLABLE
    if task_type == "pick_clean_then_place":
        return otype in CLEANABLE
    if task_type == "look_at_obj_in_light":
        return otype in LOOK_OBJECTS
    return True


def generate_world(split: str, index: int, seed: int = 0, task_type: str | None = None,
                   size: str = "full") -> HouseholdWorld:
    """Generate task ``index`` of ``split`` (deterministic in ``(split, index, seed, size)``).

    ``task_type`` overrides the round-robin type (the task id then gets a ``-<type>`` suffix so ids
    stay unique). ``size``: "full" (ALFRED-like rooms) or "small" (compact rooms, fewer distractors;
    see :func:`scene_layout`). Raises ValueError for an unknown split, task type or size, or a
    negative index.
    """
    return _generate(split, index, seed, task_type, size, goal_only=False)


def generate_goal(split: str, index: int, seed: int = 0, task_type: str | None = None,
                  size: str = "full") -> GoalSpec:
    """Just the goal of :func:`generate_world` (same draws, no placement: faster for task lists)."""
    return _generate(split, index, seed, task_type, size, goal_only=True)


def _generate(split, index, seed, task_type, size, goal_only):
    _check_split(split)
    _check_size(size)
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a non-negative int; got {index!r}")
    if task_type is None:
        ttype = TASK_TYPES[index % len(TASK_TYPES)]
        task_id = task_id_for(split, index)
    else:
        if task_type not in TASK_TYPES:
            raise ValueError(f"task_type must be one of {list(TASK_TYPES)}; got {task_type!r}")
        ttype = task_type
        task_id = f"{task_id_for(split, index)}-{task_type}"
    rng = _rng("household-task", seed, split, index, ttype)
    for _attempt in range(200):
        world = _try_generate(rng, split, ttype, task_id, seed, size, goal_only)
        if world is not None:
            return world
    raise RuntimeError(f"could not generate a {ttype} task for {split}/{index} (seed {seed})")  # pragma: no cover


def _try_generate(rng: random.Random, split: str, ttype: str, task_id: str, seed: int, size: str,
                  goal_only: bool) -> HouseholdWorld | GoalSpec | None:
    room = rng.choice(ROOMS_FOR_TASK[ttype])
    scene = rng.choice(split_scenes(split, room))
    lay = scene_layout(scene, size)
    rtypes = [t for t, _ in lay.receptacle_counts]
    appliance = APPLIANCE.get(ttype)
    if appliance is not None and appliance not in rtypes:
        return None
    if ttype == "look_at_obj_in_light" and lay.lamp_type is None:
        return None

    candidates = _candidates(scene, ttype, size)
    if not candidates:
        return None
    otype, gtype = rng.choice(candidates)
    template = rng.choice(GOAL_TEMPLATES[ttype])
    text = template.format(obj=otype, recep=gtype, toggle=lay.lamp_type) + "."
    goal = GoalSpec(task_type=ttype, object_type=otype, receptacle_type=gtype,
                    toggle_type=lay.lamp_type if ttype == "look_at_obj_in_light" else None,
                    mrecep_type=None, object_sliced=False, text=text)
    if goal_only:
        return goal

    # placement
    small = size == "small"
    if ttype == "pick_two_obj":
        n_target = 2 if small else rng.randint(2, 3)
    else:
        n_target = rng.randint(1, 2) if small else rng.randint(1, 3)
    others = [t for t in lay.object_types if t != otype]
    rng.shuffle(others)
    n_types = min(len(others), rng.randint(2, 4) if small else rng.randint(5, 10))
    counts: dict[str, int] = {otype: n_target}
    for t in others[:n_types]:
        counts[t] = 1 if small else rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
    objects: list[ObjectSpec] = []
    for ot in sorted(counts):
        hosts = _hosts(scene, ot, gtype if ot == otype else None, size)
        if not hosts:
            continue
        for k in range(1, counts[ot] + 1):
            objects.append(ObjectSpec(name=f"{ot} {k}", type=ot, number=k, parent=rng.choice(hosts),
                                      **object_properties(ot)))
    if lay.lamp_type is not None:
        objects.append(ObjectSpec(name=f"{lay.lamp_type} 1", type=lay.lamp_type, number=1, parent=lay.lamp_host,
                                  **object_properties(lay.lamp_type)))
    objects.sort(key=lambda o: (o.type, o.number))
    receptacles = tuple(
        ReceptacleSpec(name=f"{t} {i}", type=t, number=i, openable=t in OPENABLE_TYPES, opened=False)
        for t, n in lay.receptacle_counts for i in range(1, n + 1)
    )
    return HouseholdWorld(task_id=task_id, split=split, seed=seed, room=room, scene=scene,
                          receptacles=receptacles, objects=tuple(objects), goal=goal)


@functools.lru_cache(maxsize=None)
def _candidates(scene: int, ttype: str, size: str) -> tuple[tuple[str, str | None], ...]:
    """(object type, goal receptacle type) pairs a task of this type can use in this scene."""
    lay = scene_layout(scene, size)
    rtypes = [t for t, _ in lay.receptacle_counts]
    appliance = APPLIANCE.get(ttype)
    out = []
    for ot in lay.object_types:
        if not _has_property(ttype, ot):
            continue
        goals = [None] if ttype == "look_at_obj_in_light" else [
            rt for rt in rtypes if can_contain(rt, ot) and rt != appliance]
        for gt in goals:
            if any(can_contain(rt, ot) and rt != gt for rt in rtypes):
                out.append((ot, gt))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _hosts(scene: int, otype: str, exclude_type: str | None, size: str) -> tuple[str, ...]:
    """Receptacle names of the scene that can hold ``otype`` (minus those of ``exclude_type``)."""
    lay = scene_layout(scene, size)
    return tuple(f"{t} {i}" for t, n in lay.receptacle_counts for i in range(1, n + 1)
                 if can_contain(t, otype) and t != exclude_type)


def generate_split(split: str, n: int | None = None, seed: int = 0, size: str = "full") -> list[HouseholdWorld]:
    """The first ``n`` tasks of a split (default: ALFWorld's size for it)."""
    _check_split(split)
    n = DEFAULT_SPLIT_SIZES[split] if n is None else n
    return [generate_world(split, i, seed, size=size) for i in range(n)]


__all__ = [
    "SPLITS", "DEFAULT_SPLIT_SIZES", "ROOM_SCENES", "ROOMS_FOR_TASK", "SceneLayout", "scene_layout",
    "is_unseen_scene", "split_scenes", "room_of_scene", "task_id_for", "parse_task_id", "generate_world",
    "generate_split", "generate_goal", "SIZES", "CAN_CONTAIN",
]
