"""The drop-in promise, checked side by side: one script, run under torch.multiprocessing and
under ferry in the same test, must show the same (parity.py runs them). Here what goes right:
a script's namespace, contexts, what a pool's tasks are given, the names a script reaches for;
test_parity_failures.py has what goes wrong.
"""

import pytest

from parity import both, run, same

# -- 1. the script's functions share one namespace in a worker ------------------------------

def test_an_initializer_and_the_tasks_share_the_scripts_globals(tmp_path):
    same(tmp_path, """
        MODEL = None
        counter = 0

        def load(v):
            global MODEL
            MODEL = v

        def use(x):
            return (x, MODEL)

        def bump(_):
            global counter
            counter += 1
            return counter

        def read(_):
            return counter

        def mark(folder):
            open(os.path.join(folder, str(os.getpid())), "w").close()

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            with ctx.Pool(2, initializer=load, initargs=("weights",)) as p:
                print(p.map(use, range(3)))
            with ctx.Pool(1) as p:  # one worker: what one task set, the next reads
                p.map(bump, range(3), chunksize=1)
                print(p.map(read, range(2), chunksize=1))
            # The initializer runs as each worker starts, whether it gets a task or not.
            marks = f"marks-{IMPL}"
            os.mkdir(marks)
            p = ctx.Pool(3, initializer=mark, initargs=(marks,))
            p.map(abs, [1])
            p.close()
            p.join()
            print(len(os.listdir(marks)))
        """, """\
        [(0, 'weights'), (1, 'weights'), (2, 'weights')]
        [3, 3]
        3
        """)


def test_lambdas_share_the_namespace_and_see_the_callers_rebindings(tmp_path):
    """torch's pool cannot pickle a lambda; ferry's runs it in the script's namespace, where an
    initializer's global and a cache filled in place stay, and a loop variable moves on."""
    runs = both(tmp_path, """
        MODEL = None
        CACHE = {}

        def load(v):
            global MODEL
            MODEL = v
            CACHE["seen"] = "by the initializer"

        if __name__ == "__main__":
            with mp.Pool(1, initializer=load, initargs=("weights",)) as p:
                print(p.map(lambda x: (x, MODEL, CACHE.get("seen")), range(2)))
                for k in range(3):
                    print(p.map(lambda x: x + k, range(2)))
        """)
    code, out, err = runs["torch"]
    assert code != 0 and "pickle" in err.lower()
    code, out, err = runs["ferry"]
    assert code == 0, err
    assert out == ("[(0, 'weights', 'by the initializer'), (1, 'weights', 'by the initializer')]\n"
                   "[0, 1]\n[1, 2]\n[2, 3]\n")


# -- 2. a context works wherever the standard library and PyTorch take one -------------------

def test_a_contexts_members_work_where_the_standard_library_uses_them(tmp_path):
    same(tmp_path, """
        import concurrent.futures as cf

        def sq(x):
            return x * x

        def child(q, sq_, jq, lock, ev, val, d):
            with lock:
                val.value += 1
            ev.wait(30)
            q.put(("queue", val.value))
            sq_.put("simple")
            d["child"] = jq.get(timeout=30)
            jq.task_done()

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            with ctx.Pool(2) as p:
                print("pool", p.map(sq, range(4)))
            with cf.ProcessPoolExecutor(2, mp_context=ctx) as ex:
                print("executor", list(ex.map(sq, range(4))))
            q, sq_, jq = ctx.Queue(), ctx.SimpleQueue(), ctx.JoinableQueue()
            lock, ev, val = ctx.Lock(), ctx.Event(), ctx.Value("i", 41)
            with ctx.Manager() as m:
                d = m.dict()
                p = ctx.Process(target=child, args=(q, sq_, jq, lock, ev, val, d))
                p.start()
                jq.put("job")
                ev.set()
                print(q.get(timeout=30), sq_.get())
                jq.join()
                p.join(30)
                print("exit", p.exitcode, dict(d))
        """, """\
        pool [0, 1, 4, 9]
        executor [0, 1, 4, 9]
        ('queue', 42) simple
        exit 0 {'child': 'job'}
        """)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_dataloaders_dataset_keeps_multiprocessings_own_picklers(tmp_path, method):
    """A dataset holding a Value and a Connection: under spawn and forkserver they must reach
    the worker as multiprocessing sends them (ferry's context pickled them without those picklers:
    'cannot pickle mmap', and a Connection went through as the wrong fd)."""
    same(tmp_path, f"""
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Counted(Dataset):
            def __init__(self, value, conn):
                self.value, self.conn = value, conn

            def __len__(self):
                return 4

            def __getitem__(self, i):
                with self.value.get_lock():
                    self.value.value += 1
                self.conn.send(i)
                return torch.tensor([i])

        if __name__ == "__main__":
            ctx = mp.get_context("{method}")
            value = ctx.Value("i", 0)
            r, w = mp.Pipe(duplex=False)
            loader = DataLoader(Counted(value, w), batch_size=2, num_workers=1,
                                multiprocessing_context=ctx)
            print(sorted(int(x) for batch in loader for x in batch), value.value)
            print(sorted(r.recv() for _ in range(4)))
        """, """\
        [0, 1, 2, 3] 4
        [0, 1, 2, 3]
        """)


# -- 3. ferry's pieces compose: what a task and an initializer are given ----------------------

def test_locks_values_and_manager_proxies_reach_a_pools_tasks(tmp_path):
    same(tmp_path, """
        def init(lock, total, ev):
            global LOCK, TOTAL, EV
            LOCK, TOTAL, EV = lock, total, ev

        def add(x):
            with LOCK:
                TOTAL.value += x if EV.wait(30) else 1000

        def note(d, k):
            d[k] = k * k

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            total, ev = ctx.Value("i", 0), ctx.Event()
            # The lock given inline, as multiprocessing's idiom has it: the pool keeps it alive.
            with ctx.Pool(2, initializer=init, initargs=(ctx.Lock(), total, ev)) as p:
                result = p.map_async(add, range(10))
                time.sleep(0.2)
                ev.set()
                result.get(60)
            print(total.value)
            with ctx.Manager() as m:
                d = m.dict()
                with ctx.Pool(2) as p:
                    p.starmap(note, [(d, 1), (d, 2), (d, 3)])
                print(sorted(d.items()))
        """, """\
        45
        [(1, 1), (2, 4), (3, 9)]
        """)


def test_a_queue_reaches_a_pools_task_and_initializer_where_torch_refuses(tmp_path):
    runs = both(tmp_path, """
        import torch

        def init(q):
            global OUT
            OUT = q

        def produce(x):
            OUT.put((x, torch.full((3,), float(x))))
            return x

        def produce_to(q, x):
            q.put(x * 10)

        if __name__ == "__main__":
            q = mp.Queue()
            with mp.Pool(2, initializer=init, initargs=(q,)) as p:
                p.map(produce, range(4))
                got = sorted((x, t.tolist()) for x, t in (q.get(timeout=30) for _ in range(4)))
                print(got)
                p.starmap(produce_to, [(q, 1), (q, 2)])
                print(sorted(q.get(timeout=30) for _ in range(2)))
        """)
    code, out, err = runs["torch"]
    assert code != 0 and "should only be shared between processes through inheritance" in err
    code, out, err = runs["ferry"]
    assert code == 0, err
    assert out == ("[(0, [0.0, 0.0, 0.0]), (1, [1.0, 1.0, 1.0]), (2, [2.0, 2.0, 2.0]), "
                   "(3, [3.0, 3.0, 3.0])]\n[10, 20]\n")
    assert "resource_sharer" not in err and "Traceback" not in err


def test_a_lock_of_a_fork_context_is_refused_at_once_naming_the_remedy(tmp_path):
    code, out, err = run(tmp_path, """
        import multiprocessing

        def init(lock):
            pass

        if __name__ == "__main__":
            lock = multiprocessing.get_context("fork").Lock()
            try:
                mp.Pool(1, initializer=init, initargs=(lock,))
            except ValueError as e:
                print(e)
        """, "ferry")
    assert code == 0, err
    assert "fork context" in out and "ferry.Lock()" in out


# -- 8. the names a torch.multiprocessing script reaches for --------------------------------------

def test_import_ferry_as_mp_runs_a_torch_multiprocessing_script(tmp_path):
    same(tmp_path, """
        import ctypes

        def work(i, q, lock, total, arr):
            with lock:
                total.value += i
            arr[i] = i * 10
            q.put(i)

        def boom(i):
            raise ValueError(f"boom {i}")

        def echo(conn):
            conn.send(conn.recv() * 2)

        if __name__ == "__main__":
            mp.set_start_method("spawn", force=True)
            print(mp.get_start_method(), mp.cpu_count() > 0, mp.current_process().name,
                  mp.parent_process())
            q, lock, ev = mp.JoinableQueue(), mp.Lock(), mp.Event()
            total, arr = mp.Value(ctypes.c_int, 0), mp.Array("i", 3)
            ps = [mp.Process(target=work, args=(i, q, lock, total, arr)) for i in range(3)]
            for p in ps:
                p.start()
            print(sorted(q.get(timeout=30) for _ in range(3)), len(mp.active_children()) <= 3)
            for _ in range(3):
                q.task_done()
            q.join()
            for p in ps:
                p.join()
            print(total.value, list(arr), mp.active_children())
            a, b = mp.Pipe()
            p = mp.Process(target=echo, args=(b,))
            p.start()
            a.send(21)
            print(a.recv())
            p.join()
            with mp.Manager() as m:
                l = m.list([1, 2])
                print(list(l))
            mp.spawn(work, args=(q, lock, total, arr), nprocs=2)
            print(sorted(q.get(timeout=30) for _ in range(2)), total.value)
            try:
                mp.spawn(boom, nprocs=1)
            except mp.ProcessRaisedException as e:
                print("raised", "boom 0" in str(e))
            print(mp.get_sharing_strategy() in mp.get_all_sharing_strategies())
            mp.set_sharing_strategy("file_system")
            print(mp.get_sharing_strategy())
        """, """\
        spawn True MainProcess None
        [0, 1, 2] True
        3 [0, 10, 20] []
        42
        [1, 2]
        [0, 1] 4
        raised True
        True
        file_system
        """)



def test_a_pools_fresh_results_and_a_buffer_it_keeps_writing_behave_as_under_torch(tmp_path):
    """ferry's workers make their tensors in shared memory (shared allocations), so a result is
    the worker's memory, as torch.multiprocessing makes it by moving it there when it is sent:
    fresh results are each their own, and a buffer a task writes again after returning it shows
    its last write in every result it was, under both."""
    same(tmp_path, """
        import torch

        BUF = None

        def fresh(i):
            return torch.full((1 << 16,), float(i))

        def reused(i):
            global BUF
            if BUF is None:
                BUF = torch.empty(1 << 16)
            BUF.fill_(float(i))
            return BUF

        if __name__ == "__main__":
            with mp.Pool(1) as pool:
                print([t[0].item() for t in pool.map(fresh, range(4))])
                print([t[0].item() for t in pool.map(reused, range(4))])
        """, """\
        [0.0, 1.0, 2.0, 3.0]
        [3.0, 3.0, 3.0, 3.0]
        """)

# -- 9. what the standard library's own tests expect of a pool ------------------------------

def test_a_callback_has_run_once_its_result_is_ready(tmp_path):
    """multiprocessing runs a callback before it marks the result ready: code that reads what
    its callback stored right after get() or wait() finds it there. 1000 races, each way."""
    same(tmp_path, """
        def sq(x):
            return x * x

        def fail(x):
            raise ValueError(x)

        if __name__ == "__main__":
            missed = {}
            with mp.Pool(2) as p:
                for i in range(250):
                    for how in ("apply", "error", "map", "starmap"):
                        box = []
                        if how == "apply":
                            r = p.apply_async(sq, (i,), callback=box.append)
                        elif how == "error":
                            r = p.apply_async(fail, (i,), error_callback=box.append)
                        elif how == "map":
                            r = p.map_async(sq, [i, i], callback=box.append)
                        else:
                            r = p.starmap_async(pow, [(i, 2)], callback=box.append)
                        if i % 2:
                            r.wait()
                        else:
                            try:
                                r.get()
                            except ValueError:
                                pass
                        if not (box and r.ready()):
                            missed[how] = missed.get(how, 0) + 1
                print("missed", missed)
                box = []
                r = p.apply_async(sq, (3,), callback=box.append)
                print(r.get(), box, r.ready(), r.successful())
        """, """\
        missed {}
        9 [9] True True
        """)


def test_a_pool_collected_while_running_warns_and_leaves_no_worker(tmp_path):
    same(tmp_path, """
        import gc, warnings

        if __name__ == "__main__":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                p = mp.Pool(1)
                print(p.apply(abs, (-3,)))
                del p
                gc.collect()
            print([str(w.message).split(" <")[0] for w in caught
                   if issubclass(w.category, ResourceWarning)])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with mp.Pool(1) as p:
                    p.close()
                    p.join()
                del p
                gc.collect()
            print(len([w for w in caught if issubclass(w.category, ResourceWarning)]))
        """, """\
        3
        ['unclosed running multiprocessing pool']
        0
        """)


def test_maxtasksperchild_replaces_a_worker_and_runs_its_initializer_again(tmp_path):
    same(tmp_path, """
        import collections

        FOLDER = None

        def init(folder):
            global FOLDER
            FOLDER = folder
            open(os.path.join(folder, f"init-{os.getpid()}"), "w").close()

        def task(i):
            open(os.path.join(FOLDER, f"task-{os.getpid()}-{i}"), "w").close()
            return i * i

        if __name__ == "__main__":
            folder = os.path.join(os.getcwd(), "marks-" + IMPL)
            os.mkdir(folder)
            with mp.Pool(2, initializer=init, initargs=(folder,), maxtasksperchild=2) as p:
                print(p.map(task, range(10), chunksize=1))
                print(sorted(p.imap_unordered(task, range(10, 14))))
            names = os.listdir(folder)
            inits = {n.split("-")[1] for n in names if n.startswith("init-")}
            per_pid = collections.Counter(n.split("-")[1] for n in names if n.startswith("task-"))
            print(sum(per_pid.values()), max(per_pid.values()) <= 2, len(per_pid) >= 7,
                  set(per_pid) <= inits)
            for bad in (0, -1, 1.5):
                try:
                    mp.Pool(1, maxtasksperchild=bad)
                except ValueError as e:
                    print(e)
        """, """\
        [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]
        [100, 121, 144, 169]
        14 True True True
        maxtasksperchild must be a positive int or None
        maxtasksperchild must be a positive int or None
        maxtasksperchild must be a positive int or None
        """)


def test_imap_goes_on_after_a_failed_input_as_multiprocessing_does(tmp_path):
    """A failed input is raised in its place; after it, the iterator goes on where chunks are of
    one input, and ends where they are longer (multiprocessing flattens chunks with a generator).
    Quick tasks, whose results come back in batches, and a failure among them."""
    same(tmp_path, """
        def f(x):
            if x == 50:
                raise ValueError(x)
            return x

        def drain(it):
            out = []
            while True:
                try:
                    out.append(next(it))
                except StopIteration:
                    return out
                except ValueError as e:
                    out.append(f"ValueError{e.args}")

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(2) as p:
                for chunksize in (1, 4):
                    ordered = drain(p.imap(f, range(100), chunksize))
                    print(chunksize, len(ordered), ordered[48:52], ordered[-1])
                    unordered = drain(p.imap_unordered(f, range(100), chunksize))
                    # Which chunks finish before the failed one is timing's: not printed.
                    print(chunksize, "ValueError(50,)" in unordered,
                          len(unordered) if chunksize == 1 else unordered[-1])
        """, """\
        1 100 [48, 49, 'ValueError(50,)', 51] 99
        1 True 100
        4 49 ['ValueError(50,)'] ValueError(50,)
        4 True ValueError(50,)
        """)


def test_the_documented_calls_of_a_pool_and_the_queues_answer_alike(tmp_path):
    """CPython 3.11's documentation of Pool, AsyncResult, Queue, JoinableQueue and SimpleQueue,
    call by call: chunksize, callbacks, timeouts, join() after close() and after terminate(),
    qsize, empty, full, the _nowait calls, a deadline already passed, join_thread and
    cancel_join_thread, task_done and join, and what each says after close()."""
    same(tmp_path, """
        import queue, multiprocessing

        def sq(x):
            return x * x

        def fail(x):
            raise KeyError(x)

        def slow(x):
            time.sleep(x)
            return x

        if __name__ == "__main__":
            with mp.Pool(2) as p:
                for cs in (None, 1, 3, 7, 100):
                    print("chunksize", cs, p.map(sq, range(10), chunksize=cs),
                          list(p.imap(sq, range(10), chunksize=cs or 1)),
                          sorted(p.imap_unordered(sq, range(10), chunksize=cs or 1)),
                          p.starmap(pow, [(i, 2) for i in range(5)], chunksize=cs),
                          p.map_async(sq, range(4), chunksize=cs).get(60),
                          p.starmap_async(pow, [(3, 2)], chunksize=cs).get(60))
                print("imap chunksize=0", outcome(lambda: list(p.imap(sq, range(3), chunksize=0))))
                box = []
                r = p.map_async(fail, [1], error_callback=box.append)
                print("map_async error", outcome(lambda: r.get(60)), [repr(e) for e in box])
                box = []
                r = p.apply_async(fail, (2,), error_callback=box.append, callback=print)
                print("apply_async error", outcome(lambda: r.get(60)), [repr(e) for e in box],
                      r.successful())
                r = p.apply_async(slow, (1.0,))
                print("get(timeout)", outcome(lambda: r.get(0.01)))
                try:
                    r.get(0.01)
                except multiprocessing.TimeoutError:
                    print("it is multiprocessing.TimeoutError")
                print("successful() before ready", outcome(r.successful), r.ready())
                print("wait(timeout)", r.wait(0.01), r.ready())
                r.wait()
                print("after wait", r.ready(), r.successful(), r.get())
                it = p.imap(slow, [1.0])
                print("imap next(timeout)", outcome(lambda: it.next(0.01)), it.next(60),
                      outcome(lambda: next(it)))
                print("apply kwds", p.apply(sq, (), {"x": 4}))
                print("join() while running", outcome(p.join))
            p = mp.Pool(2)
            p.close()
            print("after close", outcome(lambda: p.apply(sq, (2,))), outcome(lambda: p.map(sq, [1])),
                  outcome(lambda: p.apply_async(sq, (1,))))
            p.join()
            print("join after close", outcome(p.join))
            p = mp.Pool(2)
            r = p.apply_async(slow, (30,))
            p.terminate()
            p.join()
            print("join after terminate", outcome(p.join), outcome(lambda: p.apply(sq, (2,))))
            print("Pool(0)", outcome(lambda: mp.Pool(0)), "Pool(-1)", outcome(lambda: mp.Pool(-1)),
                  "initializer=1", outcome(lambda: mp.Pool(1, initializer=1)))

            ctx = mp.get_context("fork")
            q = ctx.Queue(2)
            print("fresh", q.empty(), q.full(), q.qsize())
            q.put(1)
            q.put_nowait(2)
            time.sleep(0.2)
            print("full", q.empty(), q.full(), q.qsize())
            print("put when full", outcome(lambda: q.put_nowait(3)), outcome(lambda: q.put(3, False)),
                  outcome(lambda: q.put(3, timeout=0.05)), outcome(lambda: q.put(3, timeout=-1)))
            print("get", q.get(), q.get_nowait())
            print("get when empty", outcome(q.get_nowait), outcome(lambda: q.get(False)),
                  outcome(lambda: q.get(timeout=0.05)), outcome(lambda: q.get(timeout=-1)))
            q.put("x")
            time.sleep(0.2)
            print("get with a passed deadline", outcome(lambda: q.get(timeout=-1)))
            print("join_thread before close", outcome(q.join_thread))
            print("cancel_join_thread", outcome(q.cancel_join_thread))
            q.close()
            print("after close", outcome(q.close), outcome(q.join_thread), outcome(lambda: q.put(1)),
                  outcome(q.get), outcome(q.get_nowait), q.qsize())
            print("maxsize 0", ctx.Queue().full(), ctx.Queue(0).full())

            j = ctx.JoinableQueue()
            print("task_done() too many", outcome(j.task_done))
            j.put(1)
            j.put(2)
            print("joinable", j.get(), j.get())
            j.task_done()
            j.task_done()
            j.join()
            print("join() returned")

            s = ctx.SimpleQueue()
            print("simple", s.empty())
            s.put(5)
            time.sleep(0.1)
            print("simple", s.empty(), s.get(), s.empty())
            s.close()
            print("simple after close", outcome(s.close), outcome(s.get), outcome(lambda: s.put(1)))
        """, """\
        chunksize None [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16] [0, 1, 4, 9] [9]
        chunksize 1 [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16] [0, 1, 4, 9] [9]
        chunksize 3 [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16] [0, 1, 4, 9] [9]
        chunksize 7 [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16] [0, 1, 4, 9] [9]
        chunksize 100 [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16, 25, 36, 49, 64, 81] [0, 1, 4, 9, 16] [0, 1, 4, 9] [9]
        imap chunksize=0 ValueError
        map_async error KeyError ['KeyError(1)']
        apply_async error KeyError ['KeyError(2)'] False
        get(timeout) TimeoutError
        it is multiprocessing.TimeoutError
        successful() before ready ValueError False
        wait(timeout) None False
        after wait True True 1.0
        imap next(timeout) TimeoutError 1.0 StopIteration
        apply kwds 16
        join() while running ValueError
        after close ValueError ValueError ValueError
        join after close None
        join after terminate None ValueError
        Pool(0) ValueError Pool(-1) ValueError initializer=1 TypeError
        fresh True False 0
        full False True 2
        put when full Full Full Full Full
        get 1 2
        get when empty Empty Empty Empty Empty
        get with a passed deadline 'x'
        join_thread before close AssertionError
        cancel_join_thread None
        after close None None ValueError ValueError ValueError 0
        maxsize 0 False False
        task_done() too many ValueError
        joinable 1 2
        join() returned
        simple True
        simple False 5 True
        simple after close None OSError OSError
        """)


def test_ferry_says_its_version():
    import ferry

    assert ferry.__version__.count(".") == 2 and ferry.__version__ == ferry._C.version
