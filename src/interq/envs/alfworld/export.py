"""Household task -> real ALFWorld game directory (``game.tw-pddl`` + ``traj_data.json``).

The PDDL problem follows ALFWorld's own games (``alfworld/gen/game_states/planned_game_state.py``):
AI2-THOR object ids mangled the way ALFRED does (``|`` -> ``_bar_``, ``+`` -> ``_plus_``, ``-`` ->
``_minus_``, ``.`` -> ``_dot_``), locations ``loc|x|z|rotation|horizon``, types ``<Thor>Type`` and the
predicates of ``alfred.pddl`` (``atLocation``, ``receptacleAtLocation``, ``objectAtLocation``,
``inReceptacle``, ``receptacleType``, ``objectType``, ``canContain``, ``openable``, ``opened``,
``pickupable``, ``cleanable``, ``heatable``, ``coolable``, ``toggleable``, ``sliceable``,
``isReceptacleObject``). The goal is ALFWorld's own goal formula for the task type, taken from the
installed ``alfworld.gen.goal_library``; the grammar is the installed ``alfred.twl2`` with the task
text filled in (what ``alfworld.agents.utils.misc.add_task_to_grammar`` does, with the household goal
text instead of a random template, so both engines print the same goal).

Names: TextWorld-ALFWorld names an entity ``<type> <n>`` by sorting all ids and handing out, per type,
the numbers from the highest down (``Demangler``). The exporter picks ids whose sort order gives every
household receptacle and object exactly its own number, so "cabinet 3" is "cabinet 3" in both engines.

Locations: every receptacle gets its own location (household has no shared spots; ALFRED scenes
sometimes do, see ``layouts.py``), the agent starts at a location of no receptacle ("You are in the
middle of a room").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..household.world import ALFRED_TASK_TYPE, THOR_TYPE, HouseholdWorld

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"


def mangle(text: str) -> str:
    """ALFRED's PDDL name escaping (``fix_pddl_str_chars``): one pass, no double replacement."""
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in text)


def thor(type_name: str) -> str:
    """AI2-THOR spelling of an ALFWorld text type ("sinkbasin" -> "SinkBasin")."""
    try:
        return THOR_TYPE[type_name]
    except KeyError:
        raise ValueError(f"unknown ALFWorld type {type_name!r}; known: {sorted(THOR_TYPE)}") from None


def _coord(v: float) -> str:
    return f"{v:+06.2f}"


def loc_name(point: tuple[int, int, int, int]) -> str:
    return mangle("loc|%d|%d|%d|%d" % tuple(point))


@dataclass(frozen=True)
class Placement:
    """Where an entity is in the 3-D scene: its AI2-THOR id (unmangled) and, for receptacles, its location."""

    thor_id: str
    point: tuple[int, int, int, int] | None = None


def _synthetic_ids(world: HouseholdWorld) -> dict[str, Placement]:
    """Ids whose sorted order gives each entity its household number (highest number sorts first)."""
    out: dict[str, Placement] = {}
    counts: dict[str, int] = {}
    for e in (*world.receptacles, *world.objects):
        counts[e.type] = max(counts.get(e.type, 0), e.number)
    for i, r in enumerate(world.receptacles):
        rank = counts[r.type] - r.number   # 0 for the highest number: sorts first
        x, y, z = 0.01 * rank, 0.5 + 0.01 * (i % 50), -1.0 - 0.01 * i
        tid = f"{thor(r.type)}|{_coord(x)}|{_coord(y)}|{_coord(z)}"
        if r.type == "sinkbasin":
            tid = f"Sink|{_coord(x)}|{_coord(y)}|{_coord(z)}|SinkBasin"
        elif r.type == "bathtubbasin":
            tid = f"Bathtub|{_coord(x)}|{_coord(y)}|{_coord(z)}|BathtubBasin"
        # one location per receptacle; the agent's start (0, 0, 0, 30) is nobody's
        out[r.name] = Placement(tid, (i + 1, -(i + 1), (i % 4), 30))
    for j, o in enumerate(world.objects):
        rank = counts[o.type] - o.number
        x, y, z = 0.01 * rank, 1.0 + 0.01 * (j % 50), 1.0 + 0.01 * j
        out[o.name] = Placement(f"{thor(o.type)}|{_coord(x)}|{_coord(y)}|{_coord(z)}")
    return out


def pddl_problem(world: HouseholdWorld, placements: Mapping[str, Placement] | None = None,
                 agent_point: tuple[int, int, int, int] = (0, 0, 0, 30)) -> str:
    """The PDDL problem of ``world`` (ALFWorld naming and predicates)."""
    from alfworld.gen import goal_library  # the installed engine's own goal formulas

    places = dict(_synthetic_ids(world))
    if placements:
        places.update(placements)
    rid = {r.name: mangle(places[r.name].thor_id) for r in world.receptacles}
    oid = {o.name: mangle(places[o.name].thor_id) for o in world.objects}
    rloc = {r.name: loc_name(places[r.name].point) for r in world.receptacles}
    agent_loc = loc_name(agent_point)

    rtypes = sorted({thor(r.type) for r in world.receptacles})
    otypes = sorted({thor(o.type) for o in world.objects})
    g = world.goal
    extra_otypes = [thor(t) for t in (g.object_type, g.toggle_type) if t]
    extra_rtypes = [thor(g.receptacle_type)] if g.receptacle_type else []
    locations = sorted(set(rloc.values()) | {agent_loc})

    objs = ["agent1 - agent"]
    objs += [f"{n} - location" for n in locations]
    objs += [f"{rid[r.name]} - receptacle" for r in world.receptacles]
    objs += [f"{oid[o.name]} - object" for o in world.objects]
    # the domain names SinkBasinType/MicrowaveType/FridgeType and KnifeType/ButterKnifeType as constants
    all_rtypes = set(rtypes) | set(extra_rtypes) | {"SinkBasin", "Microwave", "Fridge"}
    objs += [f"{t}Type - rtype" for t in sorted(all_rtypes)]
    objs += [f"{t}Type - otype" for t in sorted((set(otypes) | set(extra_otypes) | {"Knife", "ButterKnife"}) - all_rtypes)]

    init = [f"(atLocation agent1 {agent_loc})"]
    for r in world.receptacles:
        init.append(f"(receptacleType {rid[r.name]} {thor(r.type)}Type)")
        init.append(f"(receptacleAtLocation {rid[r.name]} {rloc[r.name]})")
        if r.openable:
            init.append(f"(openable {rid[r.name]})")
            if r.opened:
                init.append(f"(opened {rid[r.name]})")
    for o in world.objects:
        init.append(f"(objectType {oid[o.name]} {thor(o.type)}Type)")
        init.append(f"(inReceptacle {oid[o.name]} {rid[o.parent]})")
        init.append(f"(objectAtLocation {oid[o.name]} {rloc[o.parent]})")
        for flag, pred in (("pickupable", "pickupable"), ("cleanable", "cleanable"), ("heatable", "heatable"),
                           ("coolable", "coolable"), ("toggleable", "toggleable"), ("sliceable", "sliceable"),
                           ("receptacle_object", "isReceptacleObject")):
            if getattr(o, flag):
                init.append(f"({pred} {oid[o.name]})")
    for rt, ot in world.can_contain_facts():
        init.append(f"(canContain {thor(rt)}Type {thor(ot)}Type)")

    gtype = ALFRED_TASK_TYPE[g.task_type] + ("_slice" if g.object_sliced else "")
    goal = goal_library.gdict[gtype]["pddl"].format(
        obj=thor(g.object_type), recep=thor(g.receptacle_type) if g.receptacle_type else "",
        toggle=thor(g.toggle_type) if g.toggle_type else "", mrecep=thor(g.mrecep_type) if g.mrecep_type else "")
    goal = goal.replace("#", "-")
    nl = "\n        "
    name = mangle(f"interq_{world.task_id}")
    return (f"(define (problem {name})\n(:domain alfred)\n(:objects\n        {nl.join(objs)}\n        )\n"
            f"(:init\n        {nl.join(init)}\n        )\n{goal}")


def traj_data(world: HouseholdWorld) -> dict:
    """ALFWorld's ``traj_data.json`` fields the engine and its handcoded expert read."""
    g = world.goal
    text = g.text[:-1] if g.text.endswith(".") else g.text
    return {
        "task_type": ALFRED_TASK_TYPE[g.task_type],
        "task_id": f"interq_{world.task_id}",
        "scene": {"floor_plan": f"FloorPlan{world.scene}", "scene_num": world.scene},
        "pddl_params": {
            "object_target": thor(g.object_type),
            "parent_target": thor(g.receptacle_type) if g.receptacle_type else "",
            "toggle_target": thor(g.toggle_type) if g.toggle_type else "",
            "mrecep_target": thor(g.mrecep_type) if g.mrecep_type else "",
            "object_sliced": bool(g.object_sliced),
        },
        "turk_annotations": {"anns": [{"task_desc": text, "high_descs": [], "assignment_id": "interq"}]},
        "interq": {"generator": "interq.envs.alfworld", "household_world": world.to_dict()},
    }


def write_game(world: HouseholdWorld, out_dir: str | Path, placements: Mapping[str, Placement] | None = None,
               agent_point: tuple[int, int, int, int] = (0, 0, 0, 30)) -> Path:
    """Write ``out_dir/game.tw-pddl`` and ``out_dir/traj_data.json``; returns the game file path."""
    import alfworld.info as info

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(info.ALFRED_PDDL_PATH) as f:
        domain = f.read()
    with open(info.ALFRED_TWL2_PATH) as f:
        grammar = f.read()
    g = world.goal.text
    grammar = grammar.replace("UNKNOWN GOAL", g[:-1] if g.endswith(".") else g)
    game = {"pddl_domain": domain, "grammar": grammar,
            "pddl_problem": pddl_problem(world, placements, agent_point), "solvable": True}
    tmp = out / (GAME_FILE + ".tmp")
    tmp.write_text(json.dumps(game))
    (out / TRAJ_FILE).write_text(json.dumps(traj_data(world), indent=1))
    tmp.replace(out / GAME_FILE)
    return out / GAME_FILE
