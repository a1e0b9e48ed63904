"""Offline ALFWorld game generator from the AI2-THOR scene layouts the ``alfworld`` wheel ships.

``alfworld/gen/layouts/FloorPlan<N>-objects.json`` lists the object and receptacle types of scene N,
``FloorPlan<N>-openable.json`` maps receptacle ids (``"Cabinet|+00.68|+00.50|-02.20"``) to the
agent's interaction point ``[x, z, rotation, horizon]``. A generated task (:func:`layout_world`):

1. **Task type** ``TASK_TYPES[index % 6]`` (balanced); **scene** drawn among the scenes of a room kind
   ALFRED allows for the type (heat/cool in kitchens, lamps in living rooms and bedrooms, ...) and of
   the split: ALFRED's first six scenes of every room kind are *unseen* (``valid_unseen``), the others
   *seen* (``train``, ``valid_seen``); ``train`` and ``valid_seen`` never share a task.
2. **Receptacles**: every receptacle of ``-openable.json`` with its real AI2-THOR id and interaction
   point (ALFRED's ``Sink``/``Bathtub`` become ``SinkBasin``/``BathtubBasin`` like in ALFRED's object
   ids); receptacle types that ``-objects.json`` lists but ``-openable.json`` has no point for
   (``StoveBurner``, ``Toaster``, ``CoffeeMachine``, ``GarbageCan``, ...) get one instance with a
   synthesized id and location. Several receptacles can share an interaction point, as in ALFRED
   (going to one shows the others' actions too).
3. **Objects**: the target (1-3; 2-3 for two-object tasks) and 6-12 distractors drawn from the
   scene's own object types, each in a receptacle of the scene that can hold it (ALFRED's
   ``canContain``), the target never starting in a goal-type receptacle; lamps from the scene
   (``DeskLamp``/``FloorLamp``) stand on a lamp host.
4. **Numbers** follow TextWorld-ALFWorld's own naming (sorted ids, numbers handed out from the
   highest down), so the generated :class:`HouseholdWorld` names every entity exactly as the engine
   prints it.

The result is a :class:`HouseholdWorld` (plain data) plus the placements; ``export.write_game``
turns it into a real game that ``AlfredTWEnv``'s engine plays and its handcoded expert solves.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from pathlib import Path

from ..household.generator import ROOMS_FOR_TASK, is_unseen_scene
from ..household.world import (
    APPLIANCE, CAN_CONTAIN, GOAL_TEMPLATES, LAMP_HOSTS, OPENABLE_TYPES, TASK_TYPES, THOR_TYPE, TOGGLEABLE,
    GoalSpec, HouseholdWorld, ObjectSpec, ReceptacleSpec, can_contain, object_properties,
)
from .export import Placement, mangle

SPLITS = ("train", "valid_seen", "valid_unseen")
_THOR_TO_TEXT = {"Sink": "sinkbasin", "Bathtub": "bathtubbasin"}
_LOOK_OBJECTS = frozenset({"alarmclock", "book", "bowl", "box", "cd", "cellphone", "creditcard", "cup", "keychain",
                           "laptop", "mug", "newspaper", "pen", "pencil", "pillow", "plate", "remotecontrol", "statue",
                           "vase", "watch", "tissuebox", "basketball", "baseballbat", "tennisracket", "candle"})


def layouts_dir() -> Path:
    import alfworld
    return Path(os.path.dirname(alfworld.__file__)) / "gen" / "layouts"


def room_of_scene(scene: int) -> str:
    return {0: "kitchen", 2: "livingroom", 3: "bedroom", 4: "bathroom"}[scene // 100]


@functools.lru_cache(maxsize=None)
def available_scenes() -> tuple[int, ...]:
    d = layouts_dir()
    out = []
    for f in d.glob("FloorPlan*-openable.json"):
        n = int(f.name[len("FloorPlan"):-len("-openable.json")])
        if (d / f"FloorPlan{n}-objects.json").exists():
            out.append(n)
    return tuple(sorted(out))


@functools.lru_cache(maxsize=None)
def scene_data(scene: int) -> tuple[tuple[str, ...], tuple[tuple[str, str, tuple[int, int, int, int]], ...]]:
    """(text types of the scene's objects, receptacles as (text type, thor id, point))."""
    d = layouts_dir()
    try:
        types = json.loads((d / f"FloorPlan{scene}-objects.json").read_text())
        points = json.loads((d / f"FloorPlan{scene}-openable.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"no shipped layout for scene {scene}; available: {available_scenes()}") from None
    receps = []
    for tid, p in sorted(points.items()):
        head = tid.split("|")[0]
        ttype = _THOR_TO_TEXT.get(head, head.lower())
        if ttype not in CAN_CONTAIN:
            continue
        full = tid + ("|SinkBasin" if head == "Sink" else "|BathtubBasin" if head == "Bathtub" else "")
        receps.append((ttype, full, (int(p[0] * 4), int(p[1] * 4), int(p[2]) // 90, int(p[3]))))
    present = {r[0] for r in receps}
    text_types = tuple(sorted({t.lower() for t in types}))
    # receptacle types the scene has but without interaction points: one synthesized instance each
    for k, t in enumerate(text_types):
        if t in CAN_CONTAIN and t not in present and t in {x.lower() for x in THOR_TYPE.values()} \
                and t not in ("sinkbasin", "bathtubbasin"):
            receps.append((t, f"{THOR_TYPE[t]}|+09.{k:02d}|+00.90|+09.00", (40 + k, 40 + k, 0, 30)))
    return text_types, tuple(receps)


def _rng(*parts: object) -> random.Random:
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


def _number_by_demangler(ids_by_type: dict[str, list[str]]) -> dict[str, int]:
    """TextWorld-ALFWorld's numbering: per type, sorted (lower-cased, mangled) ids get n, n-1, ..., 1."""
    out = {}
    for t, ids in ids_by_type.items():
        order = sorted(ids, key=lambda i: mangle(i).lower())
        for k, tid in enumerate(order):
            out[tid] = len(order) - k
    return out


def split_scenes(split: str, room: str) -> list[int]:
    unseen = split == "valid_unseen"
    return [s for s in available_scenes() if room_of_scene(s) == room and is_unseen_scene(s) == unseen]


def layout_world(split: str, index: int, seed: int = 0, task_type: str | None = None
                 ) -> tuple[HouseholdWorld, dict[str, Placement], tuple[int, int, int, int]]:
    """A task on a shipped scene layout: (world, placements by entity name, agent start point)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}")
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a non-negative int; got {index!r}")
    ttype = task_type or TASK_TYPES[index % len(TASK_TYPES)]
    if ttype not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {list(TASK_TYPES)}; got {ttype!r}")
    rng = _rng("interq-alfworld-layout", seed, split, index, ttype)
    for attempt in range(200):
        room = rng.choice(ROOMS_FOR_TASK[ttype])
        scenes = split_scenes(split, room)
        if not scenes:
            continue
        scene = rng.choice(scenes)
        out = _try(rng, split, index, seed, ttype, scene)
        if out is not None:
            return out
    raise RuntimeError(f"could not generate a {ttype} task for {split}/{index} (seed {seed})")


def _try(rng, split, index, seed, ttype, scene):
    otypes, receps = scene_data(scene)
    rtypes = {r[0] for r in receps}
    if ttype in APPLIANCE and APPLIANCE[ttype] not in rtypes:
        return None
    need = {"pick_clean_then_place": "cleanable", "pick_heat_then_place": "heatable",
            "pick_cool_then_place": "coolable"}.get(ttype)
    pickup = [t for t in otypes if t in THOR_TYPE and t not in TOGGLEABLE and t not in CAN_CONTAIN
              and any(can_contain(rt, t) for rt in rtypes)]
    toggle = None
    if ttype == "look_at_obj_in_light":
        lamps = [t for t in otypes if t in TOGGLEABLE]
        hosts = [r for r in receps if r[0] in LAMP_HOSTS]
        if not lamps or not hosts:
            return None
        toggle = rng.choice(sorted(lamps))
        cands = [(t, None) for t in pickup if t in _LOOK_OBJECTS]
    else:
        cands = []
        for t in pickup:
            if need and not object_properties(t)[need]:
                continue
            for rt in sorted(rtypes):
                if rt == APPLIANCE.get(ttype) or not can_contain(rt, t):
                    continue
                if not any(can_contain(r2, t) for r2 in rtypes if r2 != rt):
                    continue  # the target must start outside every goal-type receptacle
                cands.append((t, rt))
    if not cands:
        return None
    obj_t, goal_rt = rng.choice(sorted(cands))
    n_target = rng.randint(2, 3) if ttype == "pick_two_obj" else rng.randint(1, 3)
    distract_types = [t for t in pickup if t != obj_t]
    rng.shuffle(distract_types)
    distract_types = distract_types[:rng.randint(6, 12)]

    # receptacles, numbered as the engine will number them
    ids_by_type: dict[str, list[str]] = {}
    for t, tid, _ in receps:
        ids_by_type.setdefault(t, []).append(tid)
    number = _number_by_demangler(ids_by_type)
    rspecs, places = [], {}
    for t, tid, pt in receps:
        name = f"{t} {number[tid]}"
        rspecs.append(ReceptacleSpec(name=name, type=t, number=number[tid], openable=t in OPENABLE_TYPES,
                                     opened=False))
        places[name] = Placement(tid, pt)
    rspecs.sort(key=lambda r: (r.type, r.number))

    def hosts_for(t, exclude=None):
        return [r.name for r in rspecs if can_contain(r.type, t) and r.type != exclude]

    objs: list[tuple[str, str]] = []
    for _ in range(n_target):
        objs.append((obj_t, rng.choice(hosts_for(obj_t, exclude=goal_rt))))
    for t in distract_types:
        for _ in range(rng.randint(1, 2)):
            objs.append((t, rng.choice(hosts_for(t))))
    if toggle:
        objs.append((toggle, rng.choice([r.name for r in rspecs if r.type in LAMP_HOSTS])))
    counts: dict[str, int] = {}
    ospecs = []
    for t, parent in objs:
        counts[t] = counts.get(t, 0) + 1
        ospecs.append(ObjectSpec(name=f"{t} {counts[t]}", type=t, number=counts[t], parent=parent,
                                 **object_properties(t)))
    ospecs.sort(key=lambda o: (o.type, o.number))
    tmpl = rng.choice(GOAL_TEMPLATES[ttype])
    text = tmpl.format(obj=obj_t, recep=goal_rt or "", toggle=toggle or "") + "."
    goal = GoalSpec(task_type=ttype, object_type=obj_t, receptacle_type=goal_rt, toggle_type=toggle,
                    mrecep_type=None, object_sliced=False, text=text)
    used = {p.point for p in places.values()}
    agent = next((x, x, 0, 30) for x in range(-40, 100) if (x, x, 0, 30) not in used)
    world = HouseholdWorld(task_id=f"{split}-{index:05d}", split=split, seed=seed, room=room_of_scene(scene),
                           scene=scene, receptacles=tuple(rspecs), objects=tuple(ospecs), goal=goal)
    return world, places, agent
