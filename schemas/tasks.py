"""The task vocabulary, defined once: surfaces, event types, label types, objectives, tasks.

A task is (surface, label type). Label types are `click` plus the conversion types; an ad's
campaign objective is a separate attribute of the ad, not part of the task.
"""

from __future__ import annotations

SURFACES: tuple[str, ...] = (
    "fb_feed",
    "ig_feed",
    "reels",
    "stories",
    "marketplace",
    "audience_network",
)

EVENT_TYPES: tuple[str, ...] = ("impression", "click", "conversion")

CONVERSION_TYPES: tuple[str, ...] = ("offsite_purchase", "app_install", "lead")

LABEL_TYPES: tuple[str, ...] = ("click",) + CONVERSION_TYPES

OBJECTIVES: tuple[str, ...] = ("traffic", "sales", "app_promotion", "leads", "awareness")

CREATIVE_TYPES: tuple[str, ...] = ("image", "video", "carousel", "collection")

TASKS: tuple[tuple[str, str], ...] = tuple((s, lt) for s in SURFACES for lt in LABEL_TYPES)


def task_name(surface: str, label_type: str) -> str:
    """Stable string name of a task, e.g. ('reels', 'click') -> 'reels/click'."""
    if surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r}; known: {SURFACES}")
    if label_type not in LABEL_TYPES:
        raise ValueError(f"unknown label type {label_type!r}; known: {LABEL_TYPES}")
    return f"{surface}/{label_type}"


# Where a label type's figures are pooled over every surface (held-out NE, the Bayes floor), the
# surface part of the name: "all/lead".
POOLED_SURFACE = "all"


def pooled_groups(tasks: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """"all/<label type>" -> the tasks of that label type, for each label type two or more surfaces
    of `tasks` hold (pooling one surface's task would only repeat it)."""
    by_type: dict[str, list[str]] = {}
    for name in tasks:
        if "/" in name and not name.startswith(f"{POOLED_SURFACE}/"):
            by_type.setdefault(name.split("/", 1)[1], []).append(name)
    return {f"{POOLED_SURFACE}/{t}": names for t, names in by_type.items() if len(names) >= 2}
