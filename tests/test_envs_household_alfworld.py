"""household vs the real ALFWorld/TextWorld engine on the same worlds (needs the alfworld extra).

A minimal world -> PDDL problem translation, enough to load a household world into TextWorld's
PddlEnv with ALFWorld's domain, grammar and name demangler, then walk both engines with the same
commands (expert steps mixed with random admissible and invalid ones) and compare, at every step,
the admissible commands, the feedback text and the won flag.

Naming: ALFWorld's Demangler numbers the objects of one type by their PDDL ids sorted ascending,
handing out the HIGHEST number first, so ``apple 1`` must have the largest id of the apples; ids here
are ``<ThorType>_bar_<100 - number>``. Sink basins need ALFRED's ``Sink_bar_..._bar_SinkBasin`` form to be
named "sinkbasin" (likewise bathtub basins).
"""

from __future__ import annotations

import random

import pytest

pytestmark = [pytest.mark.alfworld, pytest.mark.slow]

textworld = pytest.importorskip("textworld")
alfworld_info = pytest.importorskip("alfworld.info")

from interq.envs.household import HouseholdEnv, HouseholdGame  # noqa: E402
from interq.envs.household.world import CAN_CONTAIN, THOR_TYPE, HouseholdWorld, can_contain  # noqa: E402

_PROPS = ("pickupable", "sliceable", "heatable", "coolable", "cleanable", "toggleable")


def _rid(r) -> str:
    n = f"{100 - r.number:02d}"
    if r.type == "sinkbasin":
        return f"Sink_bar_{n}_bar_SinkBasin"
    if r.type == "bathtubbasin":
        return f"Bathtub_bar_{n}_bar_BathtubBasin"
    return f"{THOR_TYPE[r.type]}_bar_{n}"


def _oid(o) -> str:
    return f"{THOR_TYPE[o.type]}_bar_{100 - o.number:02d}"


def _goal(w: HouseholdWorld) -> str:
    g = w.goal
    o = THOR_TYPE[g.object_type] + "Type"
    if g.task_type == "look_at_obj_in_light":
        return (f"(and (exists (?ot - object ?a - agent ?l - location) (and (objectType ?ot {THOR_TYPE[g.toggle_type]}Type)"
                " (toggleable ?ot) (isToggled ?ot) (objectAtLocation ?ot ?l) (atLocation ?a ?l)))"
                f" (exists (?o - object ?a - agent) (and (objectType ?o {o}) (holds ?a ?o))))")
    r = THOR_TYPE[g.receptacle_type] + "Type"
    if g.task_type == "pick_two_obj":
        return (f"(exists (?r - receptacle) (exists (?o1 - object ?o2 - object) (and (not (= ?o1 ?o2))"
                f" (receptacleType ?r {r}) (objectType ?o1 {o}) (objectType ?o2 {o}) (inReceptacle ?o1 ?r)"
                " (inReceptacle ?o2 ?r))))")
    state = {"pick_clean_then_place": "(isClean ?o)", "pick_heat_then_place": "(isHot ?o)",
             "pick_cool_then_place": "(isCool ?o)"}.get(g.task_type, "")
    return (f"(exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) (objectType ?o {o})"
            f" (receptacleType ?r {r}) {state})))")


def pddl_problem(w: HouseholdWorld) -> str:
    rtypes = sorted({r.type for r in w.receptacles} | set(CAN_CONTAIN))
    otypes = sorted({o.type for o in w.objects})
    loc = {r.name: f"loc_bar_{i + 1}" for i, r in enumerate(w.receptacles)}
    objs = ["agent1 - agent", "loc_bar_0 - location", *(f"{v} - location" for v in loc.values())]
    objs += [f"{THOR_TYPE[t]}Type - otype" for t in otypes] + [f"{THOR_TYPE[t]}Type - rtype" for t in rtypes]
    objs += [f"{_oid(o)} - object" for o in w.objects] + [f"{_rid(r)} - receptacle" for r in w.receptacles]
    init = ["(atLocation agent1 loc_bar_0)"]
    for r in w.receptacles:
        init += [f"(receptacleType {_rid(r)} {THOR_TYPE[r.type]}Type)", f"(receptacleAtLocation {_rid(r)} {loc[r.name]})"]
        init += [f"(openable {_rid(r)})"] * r.openable + [f"(opened {_rid(r)})"] * r.opened
    by_name = {r.name: r for r in w.receptacles}
    for o in w.objects:
        init += [f"(objectType {_oid(o)} {THOR_TYPE[o.type]}Type)", f"(inReceptacle {_oid(o)} {_rid(by_name[o.parent])})",
                 f"(objectAtLocation {_oid(o)} {loc[o.parent]})"]
        init += [f"({p} {_oid(o)})" for p in _PROPS if getattr(o, p)]
        init += [f"(isReceptacleObject {_oid(o)})"] * o.receptacle_object
    init += [f"(canContain {THOR_TYPE[r]}Type {THOR_TYPE[o]}Type)" for r in rtypes for o in otypes if can_contain(r, o)]
    return (f"(define (problem household) (:domain alfred) (:objects {' '.join(objs)}) (:init {' '.join(init)})"
            f" (:goal {_goal(w)}))")


def real_env(w: HouseholdWorld):
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    with open(alfworld_info.ALFRED_PDDL_PATH) as f:
        domain = f.read()
    with open(alfworld_info.ALFRED_TWL2_PATH) as f:
        grammar = f.read().replace("UNKNOWN GOAL", w.goal.task_desc)
    env = AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True)))
    env.load({"pddl_domain": domain, "grammar": grammar, "pddl_problem": pddl_problem(w)})
    return env


@pytest.mark.parametrize("size", ["full"])
def test_same_commands_text_and_outcome_as_alfworld(size):
    henv = HouseholdEnv(split_sizes={"valid_unseen": 6}, size=size)   # one task of each type
    rng = random.Random(0)
    for spec in henv.tasks("valid_unseen"):
        w = henv.world(spec)
        real, game = real_env(w), HouseholdGame(w)
        state = real.reset()
        assert state.feedback.strip() == game.intro(banner=True)
        for _ in range(60):
            assert sorted(state["admissible_commands"]) == game.admissible_commands(), spec.task_id
            u = rng.random()
            if u < 0.1:
                action = rng.choice(["look", "go to nowhere 1", f"examine {rng.choice(w.objects).name}"])
            elif u < 0.5:
                action = rng.choice(game.admissible_commands())
            else:
                action = game.expert_action()
            feedback, _ = game.step(action)
            state, _, _ = real.step(action)
            assert state.feedback.strip() == feedback.strip(), (spec.task_id, action)
            assert bool(state["won"]) == game.won(), (spec.task_id, action)
            if game.won():
                break
