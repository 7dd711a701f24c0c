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
        ({"generatr": {}}, r"generatr: unknown key; known: \['attribution_window_days'"),
        ({"spark": {"mastr": "local"}}, r"spark.mastr: unknown key; known: \['class_archive', 'conf'"),
        ({"generator": {"users": "many"}}, r"generator.users: Input should be a valid integer.*got 'many'"),
        ({"surfaces": ["reels", "myspace"]}, r"surfaces.1: Input should be 'fb_feed'.*got 'myspace'"),
        ({"retention_days": 20}, r"retention_days=20 must exceed"),
        ({"label_types": ["click", "purchase"]}, r"label_types.1: Input should be 'click'.*got 'purchase'"),
        ({"mix": {"validation_days": -1}}, r"mix.validation_days: Input should be greater than or equal to 0, got -1"),
        ({"mix": {"fixed_rates": {"reels/click": 1.5}}}, r"mix.fixed_rates.reels/click: Input should be less than or equal to 1"),
        ({"source": "kafka"}, r"source: Input should be 'synthetic' or 'landing', got 'kafka'"),
        ({"train": {"lr_decay": "linear"}}, r"train.lr_decay: Input should be 'constant' or 'cosine', got 'linear'"),
        ({"model": {"kunlun": {"events": {"click": {"depth": 0}}}}}, r"model.kunlun.events.click.depth: Input should be greater"),
        ({"ingest": {"max_event_lag_days": 7}}, r"max_event_lag_days=7 must exceed attribution_window_days=7"),
        ({"demo": {"days": 2, "bulk_days": 2}}, r"demo.bulk_days=2 must be below demo.days=2"),
    ],
)
def test_bad_config_fails_with_the_offending_path(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides, environ={})


def test_an_error_names_the_file_or_variable_its_value_came_from(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("generator:\n  users: -3\n")
    with pytest.raises(ConfigError, match=rf"generator.users \(config file {path}\): Input should be greater .*got -3"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match=r"train.steps \(\$GEM__TRAIN__STEPS\): Input should be greater .*got '0'"):
        load_config(environ={"GEM__TRAIN__STEPS": "0"})


def test_a_renamed_key_names_its_replacement(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("demo:\n  start_ds: '2026-01-01'\n  days: 3\n")
    with pytest.raises(ConfigError, match=rf"demo.start_ds \(config file {path}\): this key is gone; use start_ds"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match=r"demo.start_ds \(\$GEM__DEMO__START_DS\): this key is gone; use start_ds"):
        load_config(environ={"GEM__DEMO__START_DS": "2026-01-01"})


def test_a_variable_that_names_no_setting_is_refused():
    with pytest.raises(ConfigError, match=r"GEM__GENERATOR__USERZ names no setting: generator.userz is unknown"):
        load_config(environ={"GEM__GENERATOR__USERZ": "3"})


def test_a_section_copy_is_validated_and_the_root_copy_too():
    import dataclasses

    cfg = load_config(environ={})
    assert dataclasses.replace(cfg.loader, batch_size=64).batch_size == 64
    with pytest.raises(ValueError, match="batch_size"):
        dataclasses.replace(cfg.loader, batch_size=0)
    assert cfg.replace(lakehouse_uri="/data/lake").lakehouse_uri == "/data/lake"
    with pytest.raises(ConfigError, match="retention_days=10 must exceed"):
        cfg.replace(retention_days=10)


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
    last = shift_day(cfg.start_ds, cfg.demo.days - 1)
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
    env = {"GEM__START_DS": "2026-01-01", "GEM__DEMO__DAYS": "3", "GEM__SPARK__DRIVER_MEMORY": "4096",
           "GEM__SPARK__MASTER": "yes", "GEM__GENERATOR__USERS": "77", "GEM__GENERATOR__DIRTY_FRACTION": "0.5",
           "GEM__TRAIN__BF16": "false", "GEM__SURFACES": "reels,stories"}
    cfg = load_config(environ=env)
    assert (cfg.start_ds, cfg.demo.days) == ("2026-01-01", 3)
    assert (cfg.spark.driver_memory, cfg.spark.master) == ("4096", "yes")
    assert (cfg.generator.users, cfg.generator.dirty_fraction, cfg.train.bf16) == (77, 0.5, False)
    assert cfg.surfaces == ("reels", "stories")
    with pytest.raises(ConfigError, match=r"generator.users \(\$GEM__GENERATOR__USERS\): Input should be a valid integer.*'lots'"):
        load_config(environ={"GEM__GENERATOR__USERS": "lots"})


@pytest.mark.parametrize("environ", [
    {"GEM__SPARK": "{master: 'local[1]'}", "GEM__SPARK__MASTER": "local[2]"},
    {"GEM__SPARK__MASTER": "local[2]", "GEM__SPARK": "{master: 'local[1]'}"},
])
def test_a_section_and_one_of_its_fields_both_overridden_is_a_clear_error(environ):
    with pytest.raises(ConfigError, match=r"GEM__SPARK.*set one"):
        load_config(environ=environ)
