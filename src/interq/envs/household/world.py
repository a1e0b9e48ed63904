"""The household world as plain data: what a task is, independent of any engine.

A :class:`HouseholdWorld` holds everything needed to play one task, in ALFWorld's own vocabulary:

- receptacles ("countertop 1", "fridge 1"): type, number, openable, initially open;
- objects ("apple 2"): type, number, the receptacle they start in, and ALFRED's object properties
  (pickupable, sliceable, heatable, coolable, cleanable, toggleable, receptacle_object);
- the goal: one of ALFWorld's six task types with its targets (object type, receptacle type,
  lamp type for ``look_at_obj_in_light``; ``mrecep_type`` is always None because ALFWorld's six
  types have no movable-receptacle task) and the templated goal text ALFWorld uses
  ("put a clean apple in fridge.").

It is frozen and made only of str/int/bool/tuples, so it can be hashed, compared, pickled, and
exported (``to_dict`` / ``from_dict``) to build the same task as a real ALFWorld game (the PDDL
problem needs exactly these facts; ``THOR_TYPE`` gives AI2-THOR's spelling, e.g. ``"CounterTop"``,
and ``can_contain`` gives the ``canContain`` facts).

Type names are ALFWorld's text names: AI2-THOR class names lower-cased ("SinkBasin" -> "sinkbasin").
The property and containment tables follow ALFRED's constants (``alfworld/gen/constants.py``:
``VAL_ACTION_OBJECTS``, ``VAL_RECEPTACLE_OBJECTS``, ``OPENABLE_CLASS_LIST``), restricted to the types
the generator uses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# ALFWorld's six task types (the ``task_type`` strings of its traj_data.json, shortened).
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj",
)

# The names ALFWorld's traj_data.json uses for the same types.
ALFRED_TASK_TYPE: dict[str, str] = {
    "pick_and_place": "pick_and_place_simple",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_clean_then_place": "pick_clean_then_place_in_recep",
    "pick_heat_then_place": "pick_heat_then_place_in_recep",
    "pick_cool_then_place": "pick_cool_then_place_in_recep",
    "pick_two_obj": "pick_two_obj_and_place",
}

# ALFWorld's templated goals (two per type, picked with equal probability), without the final period.
GOAL_TEMPLATES: dict[str, tuple[str, str]] = {
    "pick_and_place": ("put a {obj} in {recep}", "put some {obj} on {recep}"),
    "look_at_obj_in_light": ("look at {obj} under the {toggle}", "examine the {obj} with the {toggle}"),
    "pick_clean_then_place": ("put a clean {obj} in {recep}", "clean some {obj} and put it in {recep}"),
    "pick_heat_then_place": ("put a hot {obj} in {recep}", "heat some {obj} and put it in {recep}"),
    "pick_cool_then_place": ("put a cool {obj} in {recep}", "cool some {obj} and put it in {recep}"),
    "pick_two_obj": ("put two {obj} in {recep}", "find two {obj} and put them in {recep}"),
}

# The appliance each transforming task type needs (ALFWorld's PDDL: HeatObject needs MicrowaveType,
# CoolObject FridgeType, CleanObject SinkBasinType).
APPLIANCE: dict[str, str] = {
    "pick_clean_then_place": "sinkbasin",
    "pick_heat_then_place": "microwave",
    "pick_cool_then_place": "fridge",
}

# AI2-THOR spelling of every type used here (for the PDDL export: ``CounterTopType``, ``Apple_bar_...``).
THOR_TYPE: dict[str, str] = {t.lower(): t for t in (
    # receptacles
    "ArmChair", "BathtubBasin", "Bed", "Cabinet", "Cart", "CoffeeMachine", "CoffeeTable", "CounterTop",
    "Desk", "DiningTable", "Drawer", "Dresser", "Fridge", "GarbageCan", "HandTowelHolder", "LaundryHamper",
    "Microwave", "Ottoman", "Safe", "Shelf", "SideTable", "SinkBasin", "Sofa", "StoveBurner", "TVStand",
    "Toaster", "Toilet", "ToiletPaperHanger", "TowelHolder",
    # objects
    "AlarmClock", "Apple", "BaseballBat", "BasketBall", "Book", "Bowl", "Box", "Bread", "ButterKnife",
    "CD", "Candle", "CellPhone", "Cloth", "CreditCard", "Cup", "DeskLamp", "DishSponge", "Egg", "FloorLamp",
    "Fork", "HandTowel", "Kettle", "KeyChain", "Knife", "Ladle", "Laptop", "Lettuce", "Mug", "Newspaper",
    "Pan", "Pen", "Pencil", "PepperShaker", "Pillow", "Plate", "Plunger", "Pot", "Potato", "RemoteControl",
    "SaltShaker", "SoapBar", "SoapBottle", "Spatula", "Spoon", "SprayBottle", "Statue", "TennisRacket",
    "TissueBox", "ToiletPaper", "Tomato", "Towel", "Vase", "Watch", "WateringCan", "WineBottle",
)}

OPENABLE_TYPES: frozenset[str] = frozenset({"fridge", "cabinet", "microwave", "drawer", "safe"})

HEATABLE: frozenset[str] = frozenset({"apple", "bread", "cup", "egg", "mug", "plate", "potato", "tomato"})
COOLABLE: frozenset[str] = frozenset({"apple", "bowl", "bread", "cup", "egg", "lettuce", "mug", "pan", "plate",
                                      "pot", "potato", "tomato", "winebottle"})
CLEANABLE: frozenset[str] = frozenset({"apple", "bowl", "butterknife", "cloth", "cup", "dishsponge", "egg", "fork",
                                       "kettle", "knife", "ladle", "lettuce", "mug", "pan", "plate", "pot", "potato",
                                       "soapbar", "spatula", "spoon", "tomato"})
SLICEABLE: frozenset[str] = frozenset({"apple", "bread", "egg", "lettuce", "potato", "tomato"})
TOGGLEABLE: frozenset[str] = frozenset({"desklamp", "floorlamp"})
MOVABLE_RECEPTACLE_TYPES: frozenset[str] = frozenset({"bowl", "box", "cup", "mug", "pan", "plate", "pot"})
KNIFE_TYPES: frozenset[str] = frozenset({"knife", "butterknife"})

_TABLETOP = frozenset({
    "alarmclock", "apple", "baseballbat", "basketball", "book", "bowl", "box", "bread", "butterknife", "candle",
    "cd", "cellphone", "cloth", "creditcard", "cup", "dishsponge", "egg", "fork", "kettle", "keychain", "knife",
    "ladle", "laptop", "lettuce", "mug", "newspaper", "pan", "pen", "pencil", "peppershaker", "plate", "pot",
    "potato", "remotecontrol", "saltshaker", "soapbar", "soapbottle", "spatula", "spoon", "spraybottle", "statue",
    "tennisracket", "tissuebox", "toiletpaper", "tomato", "vase", "watch", "wateringcan", "winebottle",
    "handtowel",
})
_SEAT = frozenset({"basketball", "book", "box", "cellphone", "cloth", "creditcard", "keychain", "laptop",
                   "newspaper", "pillow", "remotecontrol"})
_DESK = frozenset({
    "alarmclock", "basketball", "book", "bowl", "box", "candle", "cd", "cellphone", "cloth", "creditcard", "cup",
    "keychain", "laptop", "mug", "newspaper", "pen", "pencil", "plate", "remotecontrol", "spraybottle", "statue",
    "tennisracket", "tissuebox", "toiletpaper", "vase", "watch", "wateringcan", "winebottle",
})

# Which object types each receptacle type can hold (ALFRED's canContain facts).
CAN_CONTAIN: dict[str, frozenset[str]] = {
    "countertop": _TABLETOP,
    "diningtable": _TABLETOP,
    "coffeetable": _TABLETOP,
    "sidetable": _TABLETOP,
    "desk": _DESK | {"soapbottle"},
    "dresser": _DESK,
    "sofa": _SEAT,
    "armchair": _SEAT,
    "ottoman": _SEAT,
    "bed": frozenset({"baseballbat", "basketball", "book", "cellphone", "laptop", "newspaper", "pillow",
                      "tennisracket"}),
    "coffeemachine": frozenset({"mug"}),
    "microwave": frozenset({"apple", "bowl", "bread", "cup", "egg", "mug", "plate", "potato", "tomato"}),
    "stoveburner": frozenset({"kettle", "pan", "pot"}),
    "toaster": frozenset(),
    "fridge": frozenset({"apple", "bowl", "bread", "cup", "egg", "lettuce", "mug", "pan", "plate", "pot", "potato",
                         "tomato", "winebottle"}),
    "sinkbasin": frozenset({"apple", "bowl", "butterknife", "cloth", "cup", "dishsponge", "egg", "fork", "kettle",
                            "knife", "ladle", "lettuce", "mug", "pan", "plate", "pot", "potato", "soapbar", "spatula",
                            "spoon", "tomato", "handtowel"}),
    "bathtubbasin": frozenset({"cloth", "dishsponge", "soapbar", "handtowel"}),
    "cabinet": frozenset({"book", "bowl", "box", "candle", "cd", "cloth", "cup", "dishsponge", "kettle", "ladle",
                          "mug", "newspaper", "pan", "peppershaker", "plate", "plunger", "pot", "saltshaker",
                          "soapbar", "soapbottle", "spraybottle", "tissuebox", "toiletpaper", "vase", "wateringcan",
                          "winebottle", "handtowel"}),
    "drawer": frozenset({"book", "butterknife", "candle", "cd", "cellphone", "cloth", "creditcard", "dishsponge",
                         "fork", "keychain", "knife", "ladle", "newspaper", "pen", "pencil", "peppershaker",
                         "remotecontrol", "saltshaker", "soapbar", "soapbottle", "spatula", "spoon", "spraybottle",
                         "tissuebox", "toiletpaper", "watch", "wateringcan", "handtowel"}),
    "shelf": frozenset({"alarmclock", "book", "bowl", "box", "candle", "cd", "cellphone", "cloth", "creditcard",
                        "cup", "dishsponge", "kettle", "keychain", "mug", "newspaper", "pen", "pencil",
                        "peppershaker", "plate", "pot", "remotecontrol", "saltshaker", "soapbar", "soapbottle",
                        "spraybottle", "statue", "tissuebox", "toiletpaper", "vase", "watch", "wateringcan",
                        "winebottle", "handtowel"}),
    "garbagecan": frozenset({"apple", "bread", "cd", "cloth", "dishsponge", "egg", "lettuce", "newspaper", "pen",
                             "pencil", "potato", "soapbar", "soapbottle", "spraybottle", "tissuebox", "toiletpaper",
                             "tomato", "winebottle", "handtowel"}),
    "safe": frozenset({"cd", "cellphone", "creditcard", "keychain", "statue", "vase", "watch"}),
    "tvstand": frozenset({"tissuebox"}),
    "toilet": frozenset({"candle", "cloth", "dishsponge", "newspaper", "soapbar", "soapbottle", "spraybottle",
                         "tissuebox", "toiletpaper", "handtowel"}),
    "toiletpaperhanger": frozenset({"toiletpaper"}),
    "towelholder": frozenset({"towel"}),
    "handtowelholder": frozenset({"handtowel"}),
    "cart": frozenset({"candle", "cloth", "dishsponge", "mug", "plunger", "soapbar", "soapbottle", "spraybottle",
                       "statue", "tissuebox", "toiletpaper", "vase", "handtowel"}),
    "laundryhamper": frozenset({"cloth"}),
}

# Where a lamp may stand (lamps are not pickupable and are not in any canContain list; ALFWorld's
# ToggleObject needs the lamp ``inReceptacle`` a receptacle at the agent's location).
LAMP_HOSTS: frozenset[str] = frozenset({"desk", "sidetable", "dresser", "coffeetable", "shelf", "tvstand"})


def can_contain(receptacle_type: str, object_type: str) -> bool:
    """ALFRED's ``canContain`` relation between a receptacle type and an object type."""
    return object_type in CAN_CONTAIN.get(receptacle_type, frozenset())


@dataclass(frozen=True)
class ReceptacleSpec:
    """A fixed receptacle: ``name`` is what the agent reads and types ("cabinet 3")."""

    name: str         # "<type> <number>", e.g. "cabinet 3"
    type: str         # ALFWorld text type, e.g. "cabinet" (AI2-THOR "Cabinet": see THOR_TYPE)
    number: int       # 1-based, unique per type in the room
    openable: bool    # fridge, cabinet, microwave, drawer, safe
    opened: bool      # initial state; always False when not openable


@dataclass(frozen=True)
class ObjectSpec:
    """A (usually pickupable) object placed in a receptacle at the start."""

    name: str         # "<type> <number>", e.g. "apple 2"
    type: str         # ALFWorld text type, e.g. "apple"
    number: int       # 1-based, unique per type in the room
    parent: str       # name of the receptacle it starts in
    pickupable: bool = True
    sliceable: bool = False
    heatable: bool = False
    coolable: bool = False
    cleanable: bool = False
    toggleable: bool = False   # lamps: not pickupable, toggled by "use"
    receptacle_object: bool = False  # ALFRED movable receptacle (bowl, box, cup, mug, pan, plate, pot):
    #                                  PDDL isReceptacleObject; "examine" then says "This is a normal ..."


@dataclass(frozen=True)
class GoalSpec:
    """The task: ALFWorld task type, its targets (ALFWorld's ``pddl_params``) and the goal text."""

    task_type: str                 # one of TASK_TYPES
    object_type: str               # object_target, e.g. "apple"
    receptacle_type: str | None    # parent_target, e.g. "fridge"; None for look_at_obj_in_light
    toggle_type: str | None        # toggle_target ("desklamp"/"floorlamp") for look_at_obj_in_light, else None
    mrecep_type: str | None        # mrecep_target: always None (no movable-receptacle task among the six)
    object_sliced: bool            # always False here (no sliced-object goals)
    text: str                      # "put a clean apple in fridge." (without "Your task is to: ")

    @property
    def task_desc(self) -> str:
        """ALFWorld's templated task description (no final period: its grammar adds one), i.e. what
        replaces "UNKNOWN GOAL" in the game grammar."""
        return self.text[:-1] if self.text.endswith(".") else self.text


@dataclass(frozen=True)
class HouseholdWorld:
    """One household task, complete: room, initial state and goal.

    ``scene`` is the room layout number (ALFRED FloorPlan numbering: kitchens 1-30, living rooms
    201-230, bedrooms 301-330, bathrooms 401-430); ``room`` its kind. ``receptacles`` and ``objects``
    are in a canonical order (type, then number). ``task_id`` and ``split`` identify the task.
    """

    task_id: str
    split: str
    seed: int
    room: str                               # "kitchen", "livingroom", "bedroom", "bathroom"
    scene: int
    receptacles: tuple[ReceptacleSpec, ...]
    objects: tuple[ObjectSpec, ...]
    goal: GoalSpec

    @property
    def task_type(self) -> str:
        return self.goal.task_type

    @property
    def goal_text(self) -> str:
        """The task line exactly as ALFWorld prints it."""
        return f"Your task is to: {self.goal.text}"

    def receptacle(self, name: str) -> ReceptacleSpec:
        for r in self.receptacles:
            if r.name == name:
                return r
        raise KeyError(f"no receptacle named {name!r} in task {self.task_id}")

    def object(self, name: str) -> ObjectSpec:
        for o in self.objects:
            if o.name == name:
                return o
        raise KeyError(f"no object named {name!r} in task {self.task_id}")

    def can_contain_facts(self) -> list[tuple[str, str]]:
        """``(receptacle_type, object_type)`` pairs for the types present in this world (PDDL canContain)."""
        rtypes = sorted({r.type for r in self.receptacles})
        otypes = sorted({o.type for o in self.objects})
        return [(rt, ot) for rt in rtypes for ot in otypes if can_contain(rt, ot)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "HouseholdWorld":
        return HouseholdWorld(
            task_id=d["task_id"], split=d["split"], seed=int(d["seed"]), room=d["room"], scene=int(d["scene"]),
            receptacles=tuple(ReceptacleSpec(**r) for r in d["receptacles"]),
            objects=tuple(ObjectSpec(**o) for o in d["objects"]),
            goal=GoalSpec(**d["goal"]),
        )


def object_properties(otype: str) -> dict[str, bool]:
    """ALFRED's properties of an object type, as ObjectSpec keyword arguments."""
    return {
        "pickupable": otype not in TOGGLEABLE,
        "sliceable": otype in SLICEABLE,
        "heatable": otype in HEATABLE,
        "coolable": otype in COOLABLE,
        "cleanable": otype in CLEANABLE,
        "toggleable": otype in TOGGLEABLE,
        "receptacle_object": otype in MOVABLE_RECEPTACLE_TYPES,
    }
