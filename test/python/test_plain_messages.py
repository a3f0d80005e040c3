"""Plain messages: tensors and plain data travel encoded in C++, never meeting the pickler, and
arrive as the pickled way would bring them; anything else still takes the pickler."""

import collections
import pickle

import pytest
import torch

import ferry
from ferry import _C, _pickle

from parity import same


def plain(obj, max_bases=64):
    return _C.encode_plain(obj, max_bases) is not None


def test_what_counts_as_plain():
    t = torch.arange(4.0)
    for obj in [None, True, 0, -2**63, 2**63 - 1, 1.5, float("nan"), 2j, "", "héllo", b"x",
                bytearray(b"y"), (), [], {}, t, (t, [t[1:], {"k": t}]), {1: "a", (1, 2): [None]},
                {"nested": [[[[[[1]]]]]]}, torch.zeros(0), torch.tensor(3), t[::2],
                torch.ones(2, dtype=torch.complex64).conj()]:
        assert plain(obj), obj
    shared = [1]
    cyclic = []
    cyclic.append(cyclic)
    deep = []
    for _ in range(40):
        deep = [deep]
    for obj in [2**63, -2**63 - 1, "\ud800", collections.OrderedDict(a=1), torch.Size([2]),
                torch.nn.Parameter(torch.ones(2)), torch.ones(2, requires_grad=True),
                torch.ones(2).to_sparse(), [shared, shared], cyclic, deep, {1, 2}, object(),
                torch.float32, (1, [2, {"k": object()}])]:
        assert not plain(obj), obj
    # More storages than the message has room for: the pickler sends the rest by value.
    assert not plain([torch.ones(1), torch.ones(1)], max_bases=1)
    assert plain([torch.ones(1), torch.ones(1)], max_bases=2)
    t = torch.ones(4)
    assert plain([t[:2], t[2:]], max_bases=1)  # one storage


def test_a_plain_payload_is_not_a_pickle_and_decodes_to_the_same_object():
    t = ferry.zeros(6).view(2, 3)
    obj = {"a": (1, 2.5, None, True, False, "s", b"b", bytearray(b"y"), 1 + 2j),
           "t": [t, t, t[1]], 7: [], (1, "k"): {}}
    payload, bases = _pickle.dumps(obj, 64)
    assert payload[0] == _C.PLAIN_MAGIC
    assert payload[:1] != pickle.dumps(None, pickle.HIGHEST_PROTOCOL)[:1]
    assert len(bases) == 1
    back = _pickle.loads(payload, bases)
    assert list(back) == list(obj)  # dict order kept
    assert back["a"] == obj["a"] and type(back["a"][7]) is bytearray
    assert back["t"][0] is back["t"][1]  # one tensor twice is one tensor
    assert back["t"][0].equal(t) and back["t"][2].equal(t[1])
    assert back["t"][2].data_ptr() == back["t"][0].data_ptr() + 3 * 4  # a view of its storage
    assert back[7] == [] and back[(1, "k")] == {}


def test_a_malformed_plain_payload_is_refused_with_its_reason():
    payload, bases = _pickle.dumps([1, "two", torch.ones(3)], 64)
    for bad, why in [(payload[:-3], "ends inside"), (payload + b"N", "follow the object"),
                     (payload[:1] + b"\x09" + payload[2:], "version"),
                     (payload.replace(b"s\x03\x00\x00\x00two", b"s\x03\x00\x00\x00\xff\xfe\xfd"),
                      "not UTF-8")]:
        with pytest.raises(ferry.Error, match=why) as e:
            _C.decode_plain(bad, bases)
        assert "not made by this ferry" in str(e.value)
    with pytest.raises(ferry.Error, match="base 0 of 0"):
        _C.decode_plain(payload, [])


def test_plain_messages_arrive_as_torch_multiprocessing_delivers_them(tmp_path):
    """The same script under both: what arrives, its types, shared storages and identities."""
    same(tmp_path, """
        import collections, torch

        def describe(o):
            if isinstance(o, torch.Tensor):
                return f"T{tuple(o.shape)}{o.dtype}:{o.flatten()[:3].tolist()}"
            if isinstance(o, (list, tuple)):
                return type(o).__name__ + "[" + ",".join(describe(x) for x in o) + "]"
            if isinstance(o, dict):
                return "{" + ",".join(f"{describe(k)}:{describe(v)}" for k, v in o.items()) + "}"
            return f"{type(o).__name__}:{o!r}"

        def child(q, back, taken):
            for _ in range(5):
                o = q.get()
                print(describe(o), flush=True)
                if isinstance(o, dict) and "views" in o:
                    a, b = o["views"]
                    b[0] = 99.0  # a view of the other's storage sees it
                    print("same storage:", a[2].item() == 99.0, "same tensor:",
                          o["twice"][0] is o["twice"][1], flush=True)
            back.put([torch.arange(3), {"done": True}])
            taken.wait(60)  # torch's file_descriptor strategy needs the sender until then

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q, back, taken = ctx.Queue(), ctx.Queue(), ctx.Event()
            p = ctx.Process(target=child, args=(q, back, taken))
            p.start()
            base = torch.arange(6.0)
            t = torch.ones(2, 2)
            q.put(None)
            q.put((1, -2**63, 2.5, 1j, "h\\u00e9", b"\\x00b", True, [], (), {}))
            q.put({"views": [base, base[2:]], "twice": [t, t], 3: (t.t(),)})
            q.put([torch.tensor(5, dtype=torch.int8), torch.zeros(0), torch.ones(3).conj()])
            q.put({"n": [[[[1]]]], "big": 2**70, "odd": collections.OrderedDict(a=1)})
            reply = back.get()
            taken.set()
            print(describe(reply))
            p.join()
            print(p.exitcode)
        """, """\
        NoneType:None
        tuple[int:1,int:-9223372036854775808,float:2.5,complex:1j,str:'hé',bytes:b'\\x00b',bool:True,list[],tuple[],{}]
        {str:'views':list[T(6,)torch.float32:[0.0, 1.0, 2.0],T(4,)torch.float32:[2.0, 3.0, 4.0]],str:'twice':list[T(2, 2)torch.float32:[1.0, 1.0, 1.0],T(2, 2)torch.float32:[1.0, 1.0, 1.0]],int:3:tuple[T(2, 2)torch.float32:[1.0, 1.0, 1.0]]}
        same storage: True same tensor: True
        list[T()torch.int8:[5],T(0,)torch.float32:[],T(3,)torch.float32:[1.0, 1.0, 1.0]]
        {str:'n':list[list[list[list[int:1]]]],str:'big':int:1180591620717411303424,str:'odd':{str:'a':int:1}}
        list[T(3,)torch.int64:[0, 1, 2],{str:'done':bool:True}]
        0
        """)


def test_a_queue_sends_plain_and_pickled_messages_in_order():
    q = ferry.Queue()
    t = torch.arange(3)
    objs = [t, {"k": collections.OrderedDict(a=1)}, [1, "a"], 2**80, (t, t)]
    for o in objs:
        q.put(o)
    got = [q.get(timeout=5) for _ in objs]
    assert got[0].equal(t)
    assert type(got[1]["k"]) is collections.OrderedDict
    assert got[2] == [1, "a"] and got[3] == 2**80
    assert got[4][0] is got[4][1]
    with pytest.raises(__import__("queue").Empty):
        q.get(timeout=0.01)
