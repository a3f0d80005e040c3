"""The scenarios in docs/examples/, run as a user runs them."""

import os
import shutil
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "examples")


def run(args, timeout=240, prefix=(), **env):
    return subprocess.run([*prefix, sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **env))


def example(name):
    return os.path.join(EXAMPLES, name)


def test_several_producers_one_consumer_inference_in_input_order():
    r = run([example("producers_consumer.py"), "--producers", "3", "--batches", "4",
             "--devices", "cpu,cpu"])
    assert r.returncode == 0, r.stderr
    assert "batches=12 producers=3" in r.stdout and "in_order=yes" in r.stdout


def test_a_consumer_updates_the_producers_tensors_in_place():
    r = run([example("shared_updates.py"), "--tensors", "3", "--size", "100000"])
    assert r.returncode == 0, r.stderr
    assert "updated_in_place=yes shared=True copied_bytes=0" in r.stdout


def private_dev_shm(size="64m"):
    """A command prefix that runs its command with a private tmpfs of `size` on /dev/shm (a
    container's), then prints how many entries were left in it; skips where it cannot."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip(f"needs root and unshare(1) to mount a private {size} /dev/shm")
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
              f'mount -t tmpfs -o size={size} tmpfs /dev/shm || exit 99; "$0" "$@"; rc=$?; '
              'echo "dev_shm_left=$(ls -A /dev/shm | wc -l)"; exit $rc')
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private tmpfs here: {probe.stderr.strip()}")
    return prefix


def test_a_loader_in_a_container_sized_dev_shm_delivers_every_batch_through_memfds():
    r = run([example("small_shm.py"), "--batches", "8"], prefix=private_dev_shm())
    out = r.stdout + r.stderr
    assert r.returncode == 0, out  # 128 MiB kept by the trainer: six times more than fits
    assert "batches=8 loaded=yes" in r.stdout and "dev_shm_left=0" in r.stdout, out


def test_a_loader_with_segments_in_a_full_dev_shm_gets_a_clear_error_not_a_bus_error():
    # The fallback: segments are files in /dev/shm.
    r = run([example("small_shm.py"), "--batches", "8"], prefix=private_dev_shm(),
            FERRY_SHM_BACKING="dir")
    out = r.stdout + r.stderr
    assert r.returncode == 3, out  # the example's own failure, not a signal (SIGBUS: -7)
    assert "shm_exhausted" in out and "--shm-size" in out and "bytes" in out
    assert "Bus error" not in out
    assert "check_shm: shm_reserve: fail" in r.stdout  # said before anything was started
    assert "dev_shm_left=0" in r.stdout


def test_the_same_loader_with_room_delivers_every_batch():
    r = run([example("small_shm.py"), "--batches", "3"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "batches=3 loaded=yes" in r.stdout


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_dataloader_with_ferrys_context_moves_38_mb_batches(start):
    r = run([example("dataloader.py"), "--start", start, "--batches", "3"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"context=ferry start={start} workers=2 batches=3 batch_mb=38.5 samples=192" in r.stdout


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_dataloader_of_38_mb_batches_in_a_64_mib_dev_shm_finishes_with_ferrys_context(start):
    r = run([example("dataloader.py"), "--start", start, "--batches", "4"],
            prefix=private_dev_shm())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"context=ferry start={start} workers=2 batches=4 batch_mb=38.5 samples=256" in r.stdout
    assert "dev_shm_left=0" in r.stdout  # nothing left behind


def test_the_same_dataloader_with_torchs_context_dies_in_a_64_mib_dev_shm():
    r = run([example("dataloader.py"), "--context", "torch", "--batches", "4"],
            prefix=private_dev_shm())
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    # How it dies depends on the PyTorch: a worker killed by SIGBUS, or its error on the write.
    assert any(m in out for m in ("Bus error", "No space left on device",
                                  "unable to allocate shared memory", "unable to write")), out


def test_the_same_dataloader_with_torchs_spawn_context_cannot_pickle_its_lambda():
    r = run([example("dataloader.py"), "--start", "spawn", "--context", "torch", "--batches", "1"])
    assert r.returncode != 0
    assert "Can't pickle local object" in r.stderr and "lambda" in r.stderr


DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
needs_digits = pytest.mark.skipif(not os.path.exists(DIGITS),
                                  reason="python3-sklearn (the digits CSV) is not installed")


@needs_digits
@pytest.mark.parametrize("layout,start,optimizer", [("loader", "fork", "sgd"),
                                                    ("loader", "spawn", "adam"),
                                                    ("shards", "fork", "sgd")])
def test_hogwild_workers_train_one_shared_model_to_95_percent(layout, start, optimizer):
    # Hogwild's interleaving makes each run's curve its own: under a loaded suite one run of 4
    # epochs hovered at 0.91-0.94 without touching 95%, so the runs get 10 epochs to get there.
    r = run([example("hogwild.py"), "--workers", "2", "--batch", "8", "--epochs", "10",
             "--layout", layout, "--start", start, "--optimizer", optimizer,
             "--print-every", "0.05"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert any(line.startswith("t=") and "accuracy=" in line for line in lines[:-1])
    last = dict(kv.split("=") for kv in lines[-1].split())
    assert last["time_to_95"] != "none", r.stdout  # reached the target while training
    # The last figure follows the last steps of two trainers racing at a fixed learning rate, so it
    # wanders below the best (a loaded run touched 95% and ended at 0.897): this bound tells such
    # noise from a model that fell apart (about 0.1, ten classes).
    assert float(last["accuracy"]) > 0.8 and float(last["samples_per_s"]) > 0, r.stdout
    assert ("handoff_us" in last) == (layout == "loader")
