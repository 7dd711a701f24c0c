"""The one typed config: YAML <- env overrides, loud errors for unknown keys and wrong types."""

from __future__ import annotations

import pytest

from gem.config import ConfigError, GemConfig, load_config
from schemas.tasks import LABEL_TYPES, SURFACES, TASKS, task_name


def test_defaults_are_the_embedded_default():
    cfg = load_config(environ={})
    assert cfg.spark.master == "local[*]"
    assert cfg.lakehouse_uri.endswith("/lakehouse")
    assert cfg.sequence_caps.impression == 512 and cfg.sequence_caps.click == 256 and cfg.sequence_caps.conversion == 64
    assert cfg.landing_root == cfg.lakehouse_uri + "/_landing"


def test_yaml_then_env_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("generator:\n  users: 123\n  seed: 5\nspark:\n  master: local[2]\nsurfaces: [reels, stories]\n")
    env = {"GEM__GENERATOR__SEED": "9", "GEM__LAKEHOUSE_URI": "/data/lake", "GEM__SURFACES": "reels,fb_feed"}
    cfg = load_config(path, environ=env)
    assert (cfg.generator.users, cfg.generator.seed) == (123, 9)
    assert cfg.spark.master == "local[2]"
    assert cfg.lakehouse_uri == "/data/lake"
    assert cfg.surfaces == ("reels", "fb_feed")
    assert cfg.tasks[:2] == (("reels", "click"), ("reels", "offsite_purchase")) and len(cfg.tasks) == 8
    assert load_config(environ={"GEM_CONFIG": str(path)}).generator.users == 123


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"generatr": {}}, r"unknown keys \['generatr'\]"),
        ({"generator": {"users": "many"}}, r"generator.users: expected int"),
        ({"surfaces": ["reels", "myspace"]}, r"\['myspace'\] are not in schemas.tasks.SURFACES"),
        ({"retention_days": 20}, r"retention_days=20 must exceed"),
        ({"label_types": ["click", "purchase"]}, r"\['purchase'\] are not in schemas.tasks.LABEL_TYPES"),
        ({"mix": {"validation_days": -1}}, r"mix.validation_days must be >= 0, got -1"),
        ({"source": "kafka"}, r"source must be one of \('synthetic', 'landing'\), got 'kafka'"),
        ({"ingest": {"max_event_lag_days": 7}}, r"max_event_lag_days=7 must exceed attribution_window_days=7"),
    ],
)
def test_bad_config_fails_with_the_offending_path(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides, environ={})


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_demo_config_loads_and_extends_the_default():
    from gem.days import shift_day
    from gem.pipeline.demo import DEFAULT_CONFIG
    from jobs.mix import mix_days

    cfg = load_config(DEFAULT_CONFIG, environ={})
    assert isinstance(cfg, GemConfig)
    # The demo's last day mixes: a training day and a later held-out day, both with closed windows;
    # its 2 days leave none to validate on (the default validates on 1).
    last = shift_day(cfg.demo.start_ds, cfg.demo.days - 1)
    days = mix_days(cfg, last)
    assert days is not None and days.train and days.eval > days.train[-1] and days.validation == ()
    assert load_config(environ={}).mix.validation_days == 1


def test_loader_cut_is_capped_at_what_the_model_reads():
    cfg = load_config(environ={})
    lengths = cfg.model.sequence_lengths()
    assert lengths == {e: c.max_len for e, c in cfg.model.kunlun.events.items()}
    capped = cfg.loader.capped(lengths)
    assert capped.max_impressions == min(cfg.loader.max_impressions, lengths["impression"]) < cfg.loader.max_impressions
    assert capped.capped({"click": 10**6}).max_clicks == capped.max_clicks  # never longer than configured
    assert capped.length_sort_batches == cfg.loader.length_sort_batches == 1  # length-aware batching off by default
    hstu = load_config(overrides={"model": {"arch": "hstu", "hstu": {"max_len": {"impression": 5}}}}, environ={})
    assert hstu.model.sequence_lengths() == {"impression": 5}


def test_task_vocabulary_is_surface_by_label_type():
    assert len(TASKS) == len(SURFACES) * len(LABEL_TYPES) and LABEL_TYPES[0] == "click"
    assert task_name("reels", "app_install") == "reels/app_install"
    with pytest.raises(ValueError, match="unknown label type"):
        task_name("reels", "purchase")


def test_env_overrides_are_read_as_their_fields_type():
    # YAML would read 2026-01-01 as a date, "0123" as 123 and "yes" as True: each override is read
    # as the type of the field it sets, once that type is known.
    env = {"GEM__START_DS": "2026-01-01", "GEM__DEMO__START_DS": "2026-02-03", "GEM__SPARK__DRIVER_MEMORY": "4096",
           "GEM__SPARK__MASTER": "yes", "GEM__GENERATOR__USERS": "77", "GEM__GENERATOR__DIRTY_FRACTION": "0.5",
           "GEM__TRAIN__BF16": "false", "GEM__SURFACES": "reels,stories"}
    cfg = load_config(environ=env)
    assert (cfg.start_ds, cfg.demo.start_ds) == ("2026-01-01", "2026-02-03")
    assert (cfg.spark.driver_memory, cfg.spark.master) == ("4096", "yes")
    assert (cfg.generator.users, cfg.generator.dirty_fraction, cfg.train.bf16) == (77, 0.5, False)
    assert cfg.surfaces == ("reels", "stories")
    with pytest.raises(ConfigError, match=r"generator.users \(\$GEM__GENERATOR__USERS\): expected int, got str 'lots'"):
        load_config(environ={"GEM__GENERATOR__USERS": "lots"})


@pytest.mark.parametrize("environ", [
    {"GEM__SPARK": "{master: 'local[1]'}", "GEM__SPARK__MASTER": "local[2]"},
    {"GEM__SPARK__MASTER": "local[2]", "GEM__SPARK": "{master: 'local[1]'}"},
])
def test_a_section_and_one_of_its_fields_both_overridden_is_a_clear_error(environ):
    with pytest.raises(ConfigError, match=r"GEM__SPARK.*set one"):
        load_config(environ=environ)
