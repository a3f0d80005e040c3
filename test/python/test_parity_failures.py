"""The drop-in promise when things go wrong, checked side by side under torch.multiprocessing
and ferry (parity.py runs them): exceptions, Ctrl-C and signals, processes that die at any
instant. One file apart from test_parity.py, so that the suite runs the two at once.
"""

from parity import both, same

# -- 4. a task's exception keeps its type ----------------------------------------------------

def test_errors_keep_their_type_and_waits_time_out_as_multiprocessings(tmp_path):
    same(tmp_path, """
        import itertools

        def fails(x):
            if x == 2:
                raise ValueError(f"bad {x}")
            return x

        def slow(x):
            time.sleep(x)
            return x

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(2) as p:
                for call in (lambda: p.map(fails, range(4)), lambda: p.apply(fails, (2,)),
                             lambda: p.apply_async(fails, (2,)).get(30),
                             lambda: list(p.imap(fails, range(4)))):
                    try:
                        call()
                    except ValueError as e:
                        print("ValueError", e, type(e.__cause__).__name__)
                try:
                    p.apply_async(slow, (2,)).get(timeout=0.1)
                except mp.TimeoutError as e:
                    print("timed out", type(e).__module__)
                it = p.imap(slow, [1.0, 0])
                try:
                    it.next(timeout=0.05)
                except mp.TimeoutError:
                    print("next timed out")
                print(it.next(timeout=30), it.next(timeout=30))
                print(list(itertools.islice(p.imap(fails, itertools.count(3)), 4)))
        """, """\
        ValueError bad 2 RemoteTraceback
        ValueError bad 2 RemoteTraceback
        ValueError bad 2 RemoteTraceback
        ValueError bad 2 RemoteTraceback
        timed out multiprocessing.context
        next timed out
        1.0 0
        [3, 4, 5, 6]
        """)


# -- 5. Ctrl-C and signal handlers during a wait ---------------------------------------------

def test_ctrl_c_interrupts_every_wait_and_terminate_is_at_once(tmp_path):
    """Both raise KeyboardInterrupt promptly and terminate busy workers at once (ferry waited
    for the task, 14 s, and terminate() took 5 s). The bound is loose: a loaded machine must not
    fail it, and the old behaviour is ten times over it."""
    runs = both(tmp_path, """
        import signal, threading

        def slow(x):
            time.sleep(30)

        def interrupted(call):
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            t0 = time.monotonic()
            try:
                call()
            except KeyboardInterrupt:
                return time.monotonic() - t0 - 0.3

        if __name__ == "__main__":
            slow_after = []
            signal.signal(signal.SIGUSR1, lambda *a: slow_after.append(time.monotonic()))
            q = mp.Queue()
            print("get", interrupted(q.get) < 1.0)
            p = mp.get_context("spawn").Pool(2)
            p.map(abs, range(4))
            print("map", interrupted(lambda: p.map(slow, range(2))) < 1.0)
            r = p.map_async(slow, range(2))
            print("get result", interrupted(lambda: r.get()) < 1.0)
            t0 = time.monotonic()
            p.terminate()
            print("terminate", time.monotonic() - t0 < 1.0)
            p.join()
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            t0 = time.monotonic()
            try:
                q.get(timeout=2)
            except Exception as e:
                print(type(e).__name__, "handler ran during the wait:", slow_after[0] - t0 < 1.0)
        """, timeout=120)
    expected = ("get True\nmap True\nget result True\nterminate True\n"
                "Empty handler ran during the wait: True\n")
    for impl, (code, out, err) in runs.items():
        assert code == 0, f"{impl}\n{out}\n{err}"
        assert out == expected, f"{impl} printed\n{out}\n{err}"
        assert "did not stop" not in err


def test_a_dataloader_hears_ctrl_c_and_a_dead_worker_at_once(tmp_path):
    """DataLoader waits on its result queue in 5 s steps; ferry's queue heard neither Ctrl-C nor
    torch's SIGCHLD handler until a step ended (5.0 s, where torch's context took 0.5 s)."""
    same(tmp_path, """
        import signal, threading
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Slow(Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, i):
                time.sleep(30 if i >= 2 else 0)
                return torch.tensor([i])

        def first_then(act):
            it = iter(DataLoader(Slow(), batch_size=1, num_workers=2,
                                 multiprocessing_context=mp.get_context("spawn")))
            next(it)
            t0 = time.monotonic()
            threading.Timer(0.3, act, (it,)).start()
            try:
                next(it)
                next(it)
            except (KeyboardInterrupt, RuntimeError) as e:
                return type(e).__name__, time.monotonic() - t0 - 0.3 < 2.5

        if __name__ == "__main__":
            print(first_then(lambda it: os.kill(os.getpid(), signal.SIGINT)))
            print(first_then(lambda it: os.kill(it._workers[0].pid, signal.SIGKILL)))
        """, """\
        ('KeyboardInterrupt', True)
        ('RuntimeError', True)
        """)


# -- 6. a consumer can no longer wait for ever ---------------------------------------------------

def test_a_producer_that_dies_before_its_first_put_ends_the_get(tmp_path):
    """torch's get waits for its timeout; ferry's raises PeerDead naming the producer and how it
    ended, for a producer that attached and died, and one that died before it even arrived."""
    runs = both(tmp_path, """
        import queue

        class Broken:
            def __reduce__(self):
                return (os._exit, (5,))  # the child dies unpickling its arguments

        def dies(q):
            sys.exit(3)

        def never(broken, q):
            pass

        if __name__ == "__main__":
            for target, args in ((dies, ()), (never, (Broken(),))):
                q = mp.Queue()
                p = mp.get_context("spawn").Process(target=target, args=args + (q,))
                p.start()
                t0 = time.monotonic()
                try:
                    q.get(timeout=8)
                except Exception as e:  # ferry's PeerDead is a queue.Empty too
                    if type(e) is queue.Empty:
                        print("Empty", round(time.monotonic() - t0))
                    else:
                        print(type(e).__name__,
                              f"pid {p.pid} (held it; exited with code" in str(e),
                              time.monotonic() - t0 < 6)
                p.join()
        """, timeout=120)
    code, out, err = runs["torch"]
    assert code == 0 and out == "Empty 8\nEmpty 8\n", out + err
    code, out, err = runs["ferry"]
    assert code == 0, err
    assert out == "PeerDead True True\nPeerDead True True\n", out + err


# -- 7. a message outlives its sender --------------------------------------------------------------

def test_tensors_put_by_a_child_killed_next_arrive_where_torch_loses_them(tmp_path):
    """A child puts tensors and a list, lets the queue's feeder thread (torch's) flush, and is
    SIGKILLed. torch delivers the list but not the tensors, whose storage it fetches from the
    dead child; ferry delivers both, as the list."""
    runs = both(tmp_path, """
        import signal
        import torch

        def produce(q):
            for i in range(3):
                q.put(torch.full((4,), float(i)))
            q.put([9.0])
            time.sleep(1)  # torch's feeder thread writes what was put
            os.kill(os.getpid(), signal.SIGKILL)

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=produce, args=(q,))
            p.start()
            p.join()
            print("exit", p.exitcode)
            for _ in range(4):
                try:
                    x = q.get(timeout=10)
                    print(x.tolist() if isinstance(x, torch.Tensor) else x)
                except Exception as e:
                    print("lost:", type(e).__name__)
        """, timeout=120)
    code, out, err = runs["torch"]
    assert code == 0, err
    assert out.startswith("exit -9\nlost:") and out.rstrip().endswith("[9.0]"), out + err
    code, out, err = runs["ferry"]
    assert code == 0, err
    assert out == ("exit -9\n[0.0, 0.0, 0.0, 0.0]\n[1.0, 1.0, 1.0, 1.0]\n[2.0, 2.0, 2.0, 2.0]\n"
                   "[9.0]\n"), out + err


def test_an_event_whose_waiters_were_killed_still_sets_where_torchs_can_hang(tmp_path):
    """Children call is_set() in a loop and are SIGKILLed. multiprocessing's Event
    guards its flag with a lock, which a child can die holding: the parent's next set() then
    waits for ever (a DataLoader's shutdown does just that). ferry's Event takes no lock. Both
    give the same answers otherwise."""
    runs = both(tmp_path, """
        import random, signal, threading

        def spin(ev, ready):
            ev.is_set()
            ready.send(True)
            while True:
                ev.is_set()  # what a DataLoader worker calls on each index it takes

        def waiter(ev, q):
            q.put(ev.wait(30))

        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            ev = ctx.Event()
            print(ev.is_set(), ev.wait(0.05), ev.wait(-1))
            q = ctx.SimpleQueue()
            p = ctx.Process(target=waiter, args=(ev, q))
            p.start()
            time.sleep(0.3)
            ev.set()
            print(q.get(), ev.is_set(), ev.wait(), ev.wait(0))
            p.join()
            ev.clear()
            print(ev.is_set(), ev.wait(0.05))

            random.seed(1)
            # A kill that lands in the loop is inside is_set()'s lock one time in a few (hung
            # after 1 to 34 kills in ten runs on two Pythons): 200 leave torch no chance to pass.
            # The child says when it is in the loop: a fork of a process that imported torch
            # can take longer than the wait before the kill.
            for rounds in range(1, 201):
                ready, ready_w = mp.Pipe(duplex=False)
                p = ctx.Process(target=spin, args=(ev, ready_w))
                p.start()
                ready.recv()
                time.sleep(random.uniform(0.0005, 0.005))
                os.kill(p.pid, signal.SIGKILL)
                p.join()
                done = threading.Event()
                threading.Thread(target=lambda: (ev.set(), ev.clear(), done.set()),
                                 daemon=True).start()
                if not done.wait(5):
                    break
            print("set() returned" if done.is_set() else "set() hung", "after", rounds, "kills")
            sys.stdout.flush()
            os._exit(0)  # a thread may be stuck in set() for good
        """, timeout=120)
    semantics = "False False False\nTrue True True True\nFalse False\n"
    code, out, err = runs["torch"]
    assert code == 0 and out.startswith(semantics + "set() hung after "), out + err
    code, out, err = runs["ferry"]
    assert code == 0 and out == semantics + "set() returned after 200 kills\n", out + err


# -- 9. what the standard library's own tests expect when something goes wrong ----------------

def test_a_closed_queue_and_a_failing_input_fail_as_under_multiprocessing(tmp_path):
    """get() and put() after close() raise at once (ValueError; a SimpleQueue's closed handle,
    OSError), while another process still uses the queue; imap gives every result before an
    input that raised, then its error; map raises it before any task runs; and a get() whose
    producers are gone is caught by `except queue.Empty`, as a timed-out one is."""
    same(tmp_path, """
        import queue

        def sq(x):
            return x * x

        def inputs(n, ran):
            for i in range(n):
                if i == 3:
                    raise KeyError("input 3")
                ran.append(i)
                yield i

        def echo(q, out):
            out.put(q.get() + 1)

        def nothing(q):
            pass

        if __name__ == "__main__":
            for make in (mp.Queue, mp.JoinableQueue, mp.SimpleQueue):
                q, out = make(), mp.Queue()
                p = mp.Process(target=echo, args=(q, out))
                p.start()
                q.put(41)
                q.close()
                for call in (q.get, lambda: q.put(1)):
                    try:
                        call()
                    except (ValueError, OSError) as e:
                        print(type(e).__name__, end=" ")
                print(out.get(timeout=30))
                p.join()
            with mp.Pool(2) as pool:
                for chunksize in (1, 2):
                    got = []
                    try:
                        for v in pool.imap(sq, inputs(6, []), chunksize):
                            got.append(v)
                    except KeyError as e:
                        got.append(repr(e))
                    print(got)
                ran = []
                try:
                    pool.map(sq, inputs(6, ran), 2)
                except KeyError as e:
                    print(repr(e), ran)
            q = mp.Queue()
            p = mp.Process(target=nothing, args=(q,))
            p.start()
            p.join()
            try:
                q.get(timeout=2)
            except queue.Empty:
                print("Empty")
        """, """\
        ValueError ValueError 42
        ValueError ValueError 42
        OSError OSError 42
        [0, 1, 4, "KeyError('input 3')"]
        [0, 1, "KeyError('input 3')"]
        KeyError('input 3') [0, 1, 2]
        Empty
        """)


def test_a_large_exception_arrives_as_itself_with_its_traceback(tmp_path):
    """An exception that pickles is raised in the caller as itself whatever its size: its text
    whole, its worker's traceback as its cause (ferry's was a TaskError past 5.5 KiB)."""
    same(tmp_path, """
        from multiprocessing.pool import RemoteTraceback

        def boom(n):
            raise ValueError("x" * n + "!")

        if __name__ == "__main__":
            with mp.Pool(1) as p:
                for n in (1 << 20, 64 << 20):
                    try:
                        p.apply(boom, (n,))
                    except ValueError as e:
                        cause = e.__cause__
                        print(len(str(e)) == n + 1, str(e).endswith("!"),
                              isinstance(cause, RemoteTraceback), "in boom" in str(cause))
                print(p.apply(abs, (-1,)))
        """, """\
        True True True True
        True True True True
        1
        """)


def test_where_ferry_answers_otherwise_it_says_so_or_gives_the_right_answer(tmp_path):
    """The differences docs/python.md lists from CPython's own tests, side by side: map with
    chunksize=0 (multiprocessing returns Nones without running a task; ferry raises as imap
    does), a put() of an object that cannot be pickled (multiprocessing's feeder thread prints
    the error and drops it; ferry raises in the caller), a lambda as a task's result
    (MaybeEncodingError; ferry's arrives), and empty() after close() with a message queued."""
    runs = both(tmp_path, """
        class NotSerializable:
            def __reduce__(self):
                raise AttributeError("not picklable")

        def sq(x):
            return x * x

        def makes_a_lambda():
            return lambda: 42

        if __name__ == "__main__":
            with mp.Pool(2) as p:
                print("map chunksize=0", outcome(lambda: p.map(sq, range(3), chunksize=0)))
                r = p.apply_async(makes_a_lambda)
                print("lambda result", outcome(lambda: r.get(60)()))
                print("still works", p.apply(sq, (3,)))
            q = mp.get_context("fork").Queue()
            print("put unpicklable", outcome(lambda: q.put(NotSerializable())))
            q.put(True)
            print("then", q.get(timeout=30))
            q.put("x")
            time.sleep(0.3)
            q.close()
            q.join_thread()
            print("empty after close", outcome(q.empty))
        """, timeout=120)
    code, out, err = runs["torch"]
    assert code == 0, err
    assert out == ("map chunksize=0 [None, None, None]\nlambda result MaybeEncodingError\n"
                   "still works 9\nput unpicklable None\nthen True\n"
                   "empty after close OSError\n"), out + err
    assert "AttributeError: not picklable" in err  # the feeder thread's traceback, later
    code, out, err = runs["ferry"]
    assert code == 0, err
    assert out == ("map chunksize=0 ValueError\nlambda result 42\nstill works 9\n"
                   "put unpicklable AttributeError\nthen True\nempty after close False\n"), \
        out + err
