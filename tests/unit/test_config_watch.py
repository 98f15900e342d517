"""The agent's config watch on a tmp dir laid out as kubelet lays out a ConfigMap volume, and on a plain file."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from retsnoop_otel.agent.config_watch import ConfigWatch
from tests.configmap import configmap_update

SETTLE_S = 0.2


def configmap(mount: Path, text: str, _n: int = 0) -> None:
    configmap_update(mount, {"agent.yaml": text})


class Posts:
    def __init__(self) -> None:
        self.n = 0
        self.cond = threading.Condition()

    def __call__(self) -> None:
        with self.cond:
            self.n += 1
            self.cond.notify_all()

    def wait_for(self, n: int, timeout_s: float = 5.0) -> int:
        with self.cond:
            self.cond.wait_for(lambda: self.n >= n, timeout_s)
            return self.n

    def quiet(self, s: float = 3 * SETTLE_S) -> int:
        """The count once nothing more is posted for a while."""
        time.sleep(s)
        return self.n


@pytest.fixture(params=[True, False], ids=["inotify", "stat-only"])
def watch(request, tmp_path: Path) -> Iterator[tuple[Path, Posts, ConfigWatch]]:
    """A ConfigMap-style mount with its first version, watched; stat-only polls often enough for the tests."""
    mount = tmp_path / "config"
    configmap(mount, "probe_sets: one\n", 0)
    posts = Posts()
    w = ConfigWatch(str(mount / "agent.yaml"), posts, settle_s=SETTLE_S,
                    poll_s=2.0 if request.param else 0.1, use_inotify=request.param).start()
    yield mount, posts, w
    w.stop()
    assert not w.running


def test_a_configmap_swap_posts_one_reload(watch) -> None:
    mount, posts, _w = watch
    configmap(mount, "probe_sets: two\n", 1)
    assert posts.wait_for(1) == 1 and posts.quiet() == 1
    configmap(mount, "probe_sets: three\n", 2)
    assert posts.wait_for(2) == 2 and posts.quiet() == 2


def test_an_in_place_write_and_an_editors_rename_over_each_post_one(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("a\n")
    posts = Posts()
    w = ConfigWatch(str(path), posts, settle_s=SETTLE_S).start()
    try:
        with open(path, "w") as f:  # in place: the same inode
            f.write("b\n")
        assert posts.wait_for(1) == 1 and posts.quiet() == 1
        (tmp_path / ".agent.yaml.swp").write_text("c\n")  # the editor's temporary file: not the config
        os.rename(tmp_path / ".agent.yaml.swp", path)
        assert posts.wait_for(2) == 2 and posts.quiet() == 2
    finally:
        w.stop()


def test_a_burst_of_writes_posts_one_reload(watch) -> None:
    mount, posts, _w = watch
    target = mount / "..data" / "agent.yaml"
    for i in range(20):
        target.write_text(f"probe_sets: {i}\n")
    configmap(mount, "probe_sets: last\n", 1)
    assert posts.wait_for(1) == 1 and posts.quiet() == 1


def test_unrelated_files_and_the_same_bytes_post_nothing(watch) -> None:
    mount, posts, _w = watch
    (mount / "other.yaml").write_text("x\n")
    os.rename(mount / "other.yaml", mount / "moved.yaml")
    (mount / "moved.yaml").unlink()
    configmap(mount, "probe_sets: one\n", 1)  # a new directory with the same bytes: nothing to reload
    os.utime(mount / "agent.yaml")  # a touch neither
    assert posts.quiet(1.0) == 0


def test_a_change_a_sighup_reload_already_read_posts_nothing(watch) -> None:
    """The file rewritten and SIGHUP sent at once (the agent's reload reads it first): one reload, not two."""
    mount, posts, w = watch
    configmap(mount, "probe_sets: broken [\n", 1)
    w.reloading()  # what Agent.reload does before it reads the file
    assert posts.quiet(1.0) == 0
    configmap(mount, "probe_sets: fixed\n", 2)  # a later change is a change again
    assert posts.wait_for(1) == 1 and posts.quiet() == 1


def test_a_removed_then_restored_file_posts_once_it_is_back(watch) -> None:
    mount, posts, _w = watch
    (mount / "agent.yaml").unlink()
    assert posts.quiet() == 0  # gone: the running config stays
    os.symlink("..data/agent.yaml", mount / "agent.yaml")
    assert posts.quiet() == 0  # back with the bytes that run
    (mount / "agent.yaml").unlink()
    assert posts.quiet() == 0
    (mount / "agent.yaml").write_text("probe_sets: new\n")
    assert posts.wait_for(1) == 1 and posts.quiet() == 1


def test_stop_ends_the_thread_at_once(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("a\n")
    w = ConfigWatch(str(path), lambda: None, poll_s=60).start()
    t0 = time.monotonic()
    w.stop()
    assert not w.running and time.monotonic() - t0 < 1.0
