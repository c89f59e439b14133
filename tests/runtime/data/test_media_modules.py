"""``datacentric.data.media`` keeps every name it had before its three concerns moved to
modules of their own, each the very object of its new home."""

from __future__ import annotations

import importlib

import pytest

#: each name ``datacentric.data.media`` held before the split, and where it lives now
HOMES = {
    "VIDEO_SUFFIXES": "media_sources",
    "IMAGE_SUFFIXES": "media_sources",
    "PATH_COLUMNS": "media_sources",
    "METADATA_FILES": "media_sources",
    "CAPTION_COLUMNS": "media_sources",
    "MediaItem": "media_sources",
    "read_media_source": "media_sources",
    "IMAGE_PLUGINS": "media_images",
    "ANIMATED_FORMATS": "media_images",
    "MediaError": "media_info",
    "MediaInfo": "media_info",
    "probe": "media_decode",
    "decode": "media_decode",
    "ClipPlan": "clip_plans",
    "plan_clip": "clip_plans",
    "clip_rng": "clip_plans",
    "Geometry": "video_geometry",
    "even_frames": "frame_sampling",
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_media_still_gives_each_name_as_its_new_home_defines_it(name):
    media = importlib.import_module("datacentric.data.media")
    home = importlib.import_module(f"datacentric.data.{HOMES[name]}")
    assert getattr(media, name) is getattr(home, name)
    if not name.isupper():  # a class or function says where it is defined
        assert getattr(home, name).__module__ == home.__name__


def test_media_lists_exactly_those_names():
    media = importlib.import_module("datacentric.data.media")
    assert sorted(media.__all__) == sorted(HOMES)
