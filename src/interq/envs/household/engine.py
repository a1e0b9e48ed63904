"""The household game engine: ALFWorld's TextWorld rules, re-implemented in plain Python.

Rules follow ALFWorld's PDDL domain (``alfworld/data/alfred.pddl``) and text follows its grammar
(``alfworld/data/alfred.twl2``, the "move ... to" version of newer alfworld):

=====================  ==============================================  ====================================
command                precondition (admissible when)                  feedback
=====================  ==============================================  ====================================
``go to R``            R is not where the agent is                      "You arrive at R. " + examine R
``open R``/``close R`` at R, R openable and closed / open               "You open the R. " + examine R /
                                                                         "You close the R."
``take O from R``      at R, O in R, R open or not openable, hands      "You pick up the O from the R."
                       empty, O pickupable
``move O to R``        holding O, at R, R open or not openable,         "You move the O to the R."
                       canContain(R type, O type)
``heat/cool/clean O    holding O, at R, R a microwave / fridge /        "You heat the O using the R."
with R``               sinkbasin, O heatable / coolable / cleanable
``slice O with K``     holding knife/butterknife K, O sliceable and     "You sliced the O with the K."
                       in a receptacle here (open or not)
``use L``              L toggleable, in a receptacle here               "You turn on the L."
``examine R``          at R                                             "On the R, you see ..." (or open/closed)
``examine O``          holding O (the PDDL also allows O in an open     "There's nothing special about O." ...
                       receptacle here, but TextWorld never lists
                       that: checked against the real engine)
``look``               always                                           "You are facing the R. Next to it, ..."
``inventory``          always                                           "You are carrying: a O."
``help``               always                                           the command list
=====================  ==============================================  ====================================

Anything else (including an admissible-looking command whose precondition fails) answers
"Nothing happens." and leaves the state unchanged. As in TextWorld, a command must equal an admissible
command after stripping surrounding blanks (case and inner blanks matter; ``parse_action`` lower-cases
and collapses blanks before that). Lists read as ALFWorld's ("a apple 1, a bread 1, and a cup 2", "nothing"), in
(type, number descending) order. Goals are ALFWorld's PDDL goals: an object of the target type (hot /
cool / clean when the type asks) in a receptacle of the target type; two distinct ones in the same
receptacle for ``pick_two_obj``; for ``look_at_obj_in_light`` the agent holds an object of the target
type at the location of a lamp of the target type that has been turned on.

Each receptacle is its own location and the agent starts in the middle of the room (at no receptacle).
``go to`` the receptacle the agent is at is not admissible: Fast Downward drops that grounding of
GotoLocation as a no-op (its only effect re-adds ``atLocation``), so TextWorld never lists it.
``admissible_commands()`` returns ALFWorld's list including ``help``; the environment drops ``help``
from what the agent reads (as verl-agent does).
"""

from __future__ import annotations

from .world import KNIFE_TYPES, HouseholdWorld, can_contain

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
NOTHING_HAPPENS = "Nothing happens."

HELP_TEXT = (
    "\nAvailable commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object\n"
)

_TRANSFORM = {"sinkbasin": ("clean", "cleanable"), "microwave": ("heat", "heatable"), "fridge": ("cool", "coolable")}


def _order_key(name: str) -> tuple[str, int]:
    t, _, n = name.rpartition(" ")
    return (t, -int(n))


def render_list(names: list[str]) -> str:
    """ALFWorld's list: 'nothing' / 'a x 1' / 'a x 1, and a y 2' / 'a x 1, a y 2, and a z 1'."""
    if not names:
        return "nothing"
    items = [f"a {n}" for n in sorted(names, key=_order_key)]
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def normalize_command(text: str) -> str:
    return " ".join(str(text).lower().split())


class HouseholdGame:
    """One running episode of a :class:`HouseholdWorld` (mutable state, pure Python)."""

    def __init__(self, world: HouseholdWorld):
        self.world = world
        self._rec = {r.name: r for r in world.receptacles}
        self._obj = {o.name: o for o in world.objects}
        self.location: str | None = None                       # receptacle name, None = middle of the room
        self.opened: set[str] = {r.name for r in world.receptacles if r.openable and r.opened}
        self.parent: dict[str, str | None] = {o.name: o.parent for o in world.objects}  # None = held
        self.held: str | None = None
        self.hot: set[str] = set()
        self.cool: set[str] = set()
        self.clean: set[str] = set()
        self.sliced: set[str] = set()
        self.toggled: set[str] = set()
        self.checked: set[str] = set()   # receptacles whose contents the agent has seen (PDDL ``checked``)
        self.contents: dict[str, set[str]] = {r.name: set() for r in world.receptacles}
        for o in world.objects:
            if o.parent not in self.contents:
                raise ValueError(f"object {o.name!r} starts in unknown receptacle {o.parent!r}")
            self.contents[o.parent].add(o.name)
        self._admissible: dict[str, tuple] | None = None
        self._explore = True

    # ---- text --------------------------------------------------------------------------------
    def intro(self, banner: bool = True) -> str:
        """The first observation: ALFWorld's intro (banner, look, task line)."""
        head = f"{BANNER}\n\n" if banner else ""
        everything = render_list(list(self._rec))
        look = f"You are in the middle of a room. Looking quickly around you, you see {everything}."
        return f"{head}{look}\n\n{self.world.goal_text}"

    def _visible(self, r: str) -> bool:
        rec = self._rec[r]
        return not rec.openable or r in self.opened

    def _examine_receptacle(self, r: str) -> str:
        rec = self._rec[r]
        if rec.openable and r in self.opened:
            return f"The {r} is open. In it, you see {render_list(list(self.contents[r]))}."
        if rec.openable:
            return f"The {r} is closed."
        return f"On the {r}, you see {render_list(list(self.contents[r]))}."

    def _examine_object(self, o: str) -> str:
        spec = self._obj[o]
        hot, cool, clean, sliced = o in self.hot, o in self.cool, o in self.clean, o in self.sliced
        if spec.receptacle_object:
            return f"This is a normal {o}. In it, you see nothing."
        if clean and hot and sliced:
            return f"This is a hot and clean sliced {o}."
        if clean and cool and sliced:
            return f"This is a cool and clean sliced {o}."
        if clean and sliced:
            return f"This is a clean sliced {o}."
        if hot and sliced:
            return f"This is a hot sliced {o}."
        if cool and sliced:
            return f"This is a cool sliced {o}."
        if clean and hot:
            return f"This is a hot and clean {o}."
        if clean and cool:
            return f"This is a cool and clean {o}."
        if hot:
            return f"This is a hot {o}."
        if clean:
            return f"This is a clean {o}."
        if cool:
            return f"This is a cold {o}."
        if spec.toggleable:
            return f"This {o} is {'on' if o in self.toggled else 'off'}."
        if spec.sliceable and sliced:
            return f"This is a sliced {o}."
        return f"There's nothing special about {o}."

    def _look(self) -> str:
        if self.location is None:
            # The intro lists every receptacle, but the "look" command lists the receptacles at the
            # agent's location, and the start location has none (as the real engine answers).
            return "You are in the middle of a room. Looking quickly around you, you see nothing."
        return f"You are facing the {self.location}. Next to it, you see nothing."

    # ---- rules -------------------------------------------------------------------------------
    def admissible_commands(self) -> list[str]:
        """ALFWorld's admissible commands in this state (sorted; includes 'help')."""
        return sorted(self._admissible_map())

    def _admissible_map(self) -> dict[str, tuple]:
        if self._admissible is not None:
            return self._admissible
        cmds: dict[str, tuple] = {"look": ("look",), "inventory": ("inventory",), "help": ("help",)}
        for r in self._rec:
            if r != self.location:
                cmds[f"go to {r}"] = ("goto", r)
        held = self.held
        if held is not None:
            cmds[f"examine {held}"] = ("examine_obj", held)
        here = self.location
        if here is not None:
            rec = self._rec[here]
            cmds[f"examine {here}"] = ("examine_rec", here)
            if rec.openable:
                if here in self.opened:
                    cmds[f"close {here}"] = ("close", here)
                else:
                    cmds[f"open {here}"] = ("open", here)
            visible = self._visible(here)
            for o in self.contents[here]:
                spec = self._obj[o]
                if spec.toggleable:
                    cmds[f"use {o}"] = ("use", o)
                if visible:
                    if held is None and spec.pickupable:
                        cmds[f"take {o} from {here}"] = ("take", o, here)
            if held is not None:
                hspec = self._obj[held]
                if visible and can_contain(rec.type, hspec.type):
                    cmds[f"move {held} to {here}"] = ("move", held, here)
                tf = _TRANSFORM.get(rec.type)
                if tf is not None and getattr(hspec, tf[1]):
                    cmds[f"{tf[0]} {held} with {here}"] = (tf[0], held, here)
                if hspec.type in KNIFE_TYPES:
                    for o in self.contents[here]:
                        if self._obj[o].sliceable:
                            cmds[f"slice {o} with {held}"] = ("slice", o, held)
        self._admissible = cmds
        return cmds

    def step(self, command: str) -> tuple[str, bool]:
        """Apply one command. Returns (feedback, valid); invalid commands change nothing."""
        op = self._admissible_map().get(str(command).strip())
        if op is None:
            return NOTHING_HAPPENS, False
        kind = op[0]
        if kind == "look":
            return self._look(), True
        if kind == "inventory":
            if self.held is None:
                return "You are not carrying anything.", True
            return f"You are carrying: a {self.held}.", True
        if kind == "help":
            return HELP_TEXT, True
        if kind == "examine_rec":
            return self._examine_receptacle(op[1]), True
        if kind == "examine_obj":
            return self._examine_object(op[1]), True
        self._admissible = None  # every remaining command may change the state
        if kind == "goto":
            self.location = op[1]
            if self._visible(op[1]):
                self.checked.add(op[1])
            return f"You arrive at {op[1]}. {self._examine_receptacle(op[1])}", True
        if kind == "open":
            self.opened.add(op[1])
            self.checked.add(op[1])
            return f"You open the {op[1]}. {self._examine_receptacle(op[1])}", True
        if kind == "close":
            self.opened.discard(op[1])
            return f"You close the {op[1]}.", True
        if kind == "take":
            _, o, r = op
            self.contents[r].discard(o)
            self.parent[o] = None
            self.held = o
            return f"You pick up the {o} from the {r}.", True
        if kind == "move":
            _, o, r = op
            self.contents[r].add(o)
            self.parent[o] = r
            self.held = None
            return f"You move the {o} to the {r}.", True
        if kind == "heat":
            self.hot.add(op[1])
            self.cool.discard(op[1])
            return f"You heat the {op[1]} using the {op[2]}.", True
        if kind == "cool":
            self.cool.add(op[1])
            self.hot.discard(op[1])
            return f"You cool the {op[1]} using the {op[2]}.", True
        if kind == "clean":
            self.clean.add(op[1])
            return f"You clean the {op[1]} using the {op[2]}.", True
        if kind == "slice":
            self.sliced.add(op[1])
            return f"You sliced the {op[1]} with the {op[2]}.", True
        if kind == "use":
            self.toggled.add(op[1])
            return f"You turn on the {op[1]}.", True
        raise AssertionError(kind)  # pragma: no cover

    # ---- goal ----------------------------------------------------------------------------------
    def _ok(self, o: str) -> bool:
        """Object ``o`` has the target type and the state the task type asks for."""
        g = self.world.goal
        if self._obj[o].type != g.object_type:
            return False
        if g.task_type == "pick_clean_then_place":
            return o in self.clean
        if g.task_type == "pick_heat_then_place":
            return o in self.hot
        if g.task_type == "pick_cool_then_place":
            return o in self.cool
        return True

    def won(self) -> bool:
        g = self.world.goal
        if g.task_type == "look_at_obj_in_light":
            if self.held is None or self._obj[self.held].type != g.object_type or self.location is None:
                return False
            return any(self._obj[o].type == g.toggle_type and o in self.toggled for o in self.contents[self.location])
        need = 2 if g.task_type == "pick_two_obj" else 1
        for r, rec in self._rec.items():
            if rec.type == g.receptacle_type and sum(1 for o in self.contents[r] if self._ok(o)) >= need:
                return True
        return False

    # ---- expert ------------------------------------------------------------------------------
    def expert_action(self, explore: bool = True) -> str | None:
        """The expert's next action from the current state (None once the goal holds).

        ``explore=True`` (default): the expert knows only what the agent has seen. To find an object
        (or the lamp) it visits, in canonical order (type, then number), the unchecked receptacles
        that can hold it, opening closed ones, until it sees one; so its demonstrations are
        consistent with the observations (a policy can imitate them). ``explore=False``: it knows the
        whole world and goes straight to the nearest instance (shortest plans).

        Replans from the current state on every call, so it recovers from any detour (noise, a wrong
        move). Every returned action is admissible.
        """
        self._explore = explore
        if self.won():
            return None
        g = self.world.goal
        held = self.held
        if g.task_type == "look_at_obj_in_light":
            if held is not None and self._obj[held].type == g.object_type:
                lamps = [o for o in self._obj if self._obj[o].type == g.toggle_type]
                known = [o for o in lamps if self.parent[o] in self.checked] if self._explore else lamps
                if not known:
                    return self._explore_for(g.toggle_type, lamp=True)
                lamp = min(known, key=_order_key)
                host = self.parent[lamp]
                if self.location != host:
                    return f"go to {host}"
                return f"use {lamp}"
            if held is not None:
                return self._put_down(held)
            return self._fetch([o for o in self._obj if self._obj[o].type == g.object_type])
        # placing tasks
        target = self._goal_receptacle()
        placed = [o for o in self.contents[target] if self._ok(o)]
        if held is not None and self._obj[held].type == g.object_type:
            appliance = {"pick_clean_then_place": "sinkbasin", "pick_heat_then_place": "microwave",
                         "pick_cool_then_place": "fridge"}.get(g.task_type)
            if appliance is not None and not self._ok(held):
                app = min((r for r in self._rec if self._rec[r].type == appliance), key=_order_key)
                if self.location != app:
                    return f"go to {app}"
                return f"{_TRANSFORM[appliance][0]} {held} with {app}"
            if self.location != target:
                return f"go to {target}"
            if target not in self.opened and self._rec[target].openable:
                return f"open {target}"
            return f"move {held} to {target}"
        if held is not None:
            return self._put_down(held)
        candidates = [o for o in self._obj if self._obj[o].type == g.object_type and o not in placed]
        return self._fetch(candidates)

    def _goal_receptacle(self) -> str:
        """The receptacle the expert fills: the one of the goal type holding most finished targets."""
        g = self.world.goal
        names = sorted((r for r in self._rec if self._rec[r].type == g.receptacle_type),
                       key=lambda r: (-sum(1 for o in self.contents[r] if self._ok(o)), self._rec[r].number))
        return names[0]

    def _explore_for(self, otype: str, lamp: bool = False) -> str:
        """Next step of the search for an object of ``otype``: go to / open the next unchecked receptacle."""
        from .world import LAMP_HOSTS
        here = self.location
        if here is not None and here not in self.checked and self._rec[here].openable:
            return f"open {here}"
        order = sorted(self._rec, key=lambda r: (self._rec[r].type, self._rec[r].number))
        for r in order:
            if r in self.checked:
                continue
            rt = self._rec[r].type
            if (rt in LAMP_HOSTS) if lamp else can_contain(rt, otype):
                return f"go to {r}"
        # everything plausible was checked (cannot happen with generated worlds): look everywhere
        for r in order:
            if r not in self.checked:
                return f"go to {r}"
        raise RuntimeError(f"expert: no {otype} anywhere in task {self.world.task_id}")  # pragma: no cover

    def _fetch(self, candidates: list[str]) -> str:
        if self._explore:
            known = [o for o in candidates if self.parent[o] in self.checked]
            if not known:
                return self._explore_for(self._obj[candidates[0]].type)
            candidates = known
        # prefer an object at the current location, then the lowest receptacle/object numbers
        def key(o: str) -> tuple:
            r = self.parent[o]
            return (r != self.location, _order_key(r or "")[0], -_order_key(r or "x 0")[1], _order_key(o)[0],
                    -_order_key(o)[1])
        o = min(candidates, key=key)
        r = self.parent[o]
        assert r is not None
        if self.location != r:
            return f"go to {r}"
        if not self._visible(r):
            return f"open {r}"
        return f"take {o} from {r}"

    def _put_down(self, held: str) -> str:
        """Put a wrong object down: here if allowed, else back where some receptacle takes it."""
        here = self.location
        ot = self._obj[held].type
        if here is not None and can_contain(self._rec[here].type, ot):
            if not self._visible(here):
                return f"open {here}"
            return f"move {held} to {here}"
        r = min((r for r in self._rec if can_contain(self._rec[r].type, ot)), key=lambda r: (self._rec[r].openable, _order_key(r)[0], -_order_key(r)[1]))
        return f"go to {r}"
