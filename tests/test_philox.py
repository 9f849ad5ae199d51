"""Philox4x32-10 and the random streams of kernels/README.md §6.

* torch.ops.repops.philox against the Random123 known-answer vectors (kat_vectors, the three
  "philox4x32 10" lines: counter c0..c3, key k0 k1 -> four output words), and against an
  independent vectorised NumPy Philox4x32-10 written here from the published algorithm
  (Salmon et al., SC'11) over many blocks, offsets, streams and seeds;
* counter = (block_offset + i // 4, c1, c2, purpose), key = (seed low 32, seed high 32),
  seed passed as a signed int64;
* uniform(...) = (w >> 8) * 2^-24 of the same words, exactly, in [0, 1);
* normal(...) ~ N(0, 1) (loose statistics over 10^6 samples) and close to a float64 NumPy
  evaluation of the §6 Box-Muller formula on the same words (bitwise equality is the
  reference test's job);
* different (c1, c2, purpose) streams and seeds differ; the same arguments give the same bits.
"""
import numpy as np
import pytest
import torch

import repops  # noqa: F401  (tests/conftest.py builds and loads torch.ops.repops)

M32 = 0xFFFFFFFF

# Random123 kat_vectors: "philox4x32 10  CTR[4]  KEY[2]  EXPECTED[4]".
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def signed64(seed):
    """The int64 a uint64 seed is passed as."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= (1 << 63) else seed


def philox_op(seed, c1, c2, purpose, n, block_offset=0):
    out = torch.ops.repops.philox(signed64(seed), c1, c2, purpose, n, block_offset)
    assert out.dtype == torch.int64 and tuple(out.shape) == (n,)
    w = out.numpy()
    assert np.all((w >= 0) & (w <= M32)), "philox words must be uint32 values"
    return w.astype(np.uint64)


def np_philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint64 arrays holding uint32 values (independent of the kernels)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & M32 for c in (c0, c1, c2, c3))
    shape = np.broadcast(c0, c1, c2, c3).shape
    c0, c1, c2, c3 = (np.broadcast_to(c, shape).copy() for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0 & M32), np.uint64(k1 & M32)
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    w0, w1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
    mask, s32 = np.uint64(M32), np.uint64(32)
    for _ in range(10):
        p0 = m0 * c0            # < 2^64: exact in uint64
        p1 = m1 * c2
        c0, c1, c2, c3 = ((p1 >> s32) ^ c1 ^ k0, p1 & mask, (p0 >> s32) ^ c3 ^ k1, p0 & mask)
        k0, k1 = (k0 + w0) & mask, (k1 + w1) & mask
    return np.stack([c0, c1, c2, c3], axis=-1)


def np_words(seed, c1, c2, purpose, n, block_offset=0):
    nb = (n + 3) // 4
    blocks = (np.arange(nb, dtype=np.uint64) + np.uint64(block_offset)) & np.uint64(M32)
    seed &= (1 << 64) - 1
    return np_philox(blocks, c1, c2, purpose, seed & M32, seed >> 32).reshape(-1)[:n]


# ----------------------------------------------------------------------------------------

def test_numpy_philox_matches_kat():
    """The independent NumPy Philox used below is itself right."""
    for ctr, key, want in KAT:
        got = np_philox(*ctr, *key)
        assert [int(v) for v in got] == list(want)


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_kat_vectors(ctr, key, want):
    seed = key[0] | (key[1] << 32)
    c0, c1, c2, c3 = ctr
    got = philox_op(seed, c1, c2, c3, 4, c0)
    assert [f"{int(v):08x}" for v in got] == [f"{v:08x}" for v in want]


@pytest.mark.parametrize("seed,c1,c2,purpose,n,offset", [
    (0, 0, 0, 0, 4096, 0),
    (1234, 7, 3, repops.PURPOSE_INIT, 10_001, 0),            # n not a multiple of 4
    (2 ** 63 + 12345, 2 ** 32 - 1, 5, repops.PURPOSE_DROPOUT, 999, 17),   # negative int64 seed
    (2 ** 64 - 1, 123456789, 987654321, repops.PURPOSE_DATA, 4000, 2 ** 32 - 600),  # wraps c0
    (0xDEADBEEFCAFEF00D, 1, 2, repops.PURPOSE_SAMPLE, 1, 5),
    (42, 0, 0, 0, 0, 0),
])
def test_words_match_numpy_philox(seed, c1, c2, purpose, n, offset):
    got = philox_op(seed, c1, c2, purpose, n, offset)
    want = np_words(seed, c1, c2, purpose, n, offset)
    assert got.shape == want.shape
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"first mismatch at element {bad[0]}: {int(got[bad[0]]):08x} != {int(want[bad[0]]):08x}"


def test_block_offset_is_the_counter():
    """Element i of a stream lives in block i // 4: an offset view is a slice of the stream."""
    full = philox_op(99, 3, 4, 2, 4 * 300)
    part = philox_op(99, 3, 4, 2, 4 * 100, 200)
    assert np.array_equal(full[800:], part)
    # repops.philox_words (the host helper) gives the same stream
    hw = repops.philox_words(99, 3, 4, 2, 4 * 300)
    assert np.array_equal(np.asarray(hw).astype(np.uint64), full)


def test_same_arguments_same_bits():
    a = torch.ops.repops.philox(7, 1, 2, 3, 100_003, 0)
    b = torch.ops.repops.philox(7, 1, 2, 3, 100_003, 0)
    assert torch.equal(a, b)
    for op in (torch.ops.repops.uniform, torch.ops.repops.normal):
        x = op(7, 1, 2, 3, 100_003)
        y = op(7, 1, 2, 3, 100_003)
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))


def test_streams_differ():
    base = (11, 5, 6, 2)
    variants = [(12, 5, 6, 2), (11, 6, 6, 2), (11, 5, 7, 2), (11, 5, 6, 3),
                (11 + (1 << 32), 5, 6, 2), (11, 6, 5, 2)]
    w0 = philox_op(*base, 4096)
    for v in variants:
        w = philox_op(*v, 4096)
        # independent streams: essentially no coincidences (expected 4096 / 2^32)
        assert np.sum(w == w0) <= 2, v
    u0 = torch.ops.repops.uniform(*base, 4096)
    for v in variants:
        assert not torch.equal(torch.ops.repops.uniform(*v, 4096), u0), v
        assert not torch.equal(torch.ops.repops.normal(*v, 4096), torch.ops.repops.normal(*base, 4096)), v


def test_uniform_is_exact_function_of_words():
    n = 200_003
    for args in [(5, 1, 2, repops.PURPOSE_INIT), (2 ** 63 + 1, 2 ** 32 - 1, 0, repops.PURPOSE_SAMPLE)]:
        u = torch.ops.repops.uniform(signed64(args[0]), *args[1:], n)
        assert u.dtype == torch.float32 and tuple(u.shape) == (n,)
        u = u.numpy().astype(np.float64)
        w = philox_op(*args, n)
        want = (w >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
        assert np.array_equal(u, want)
        assert u.min() >= 0.0 and u.max() < 1.0
        k = u * 2.0 ** 24
        assert np.array_equal(k, np.floor(k))              # exact multiples of 2^-24
    # loose statistics: mean 1/2, variance 1/12
    u = torch.ops.repops.uniform(3, 0, 0, repops.PURPOSE_INIT, 1_000_000).numpy().astype(np.float64)
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001


def box_muller64(w):
    """§6 Box-Muller on words w (uint64 array, length multiple of 4), in float64."""
    w = w.reshape(-1, 4)
    out = np.empty(w.shape, dtype=np.float64)
    twopi = float(np.float32(6.28318548))
    for a, b in ((0, 1), (2, 3)):
        u1 = ((w[:, a] >> np.uint64(8)) + np.uint64(1)).astype(np.float64) * 2.0 ** -24
        u2 = (w[:, b] >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
        rad = np.sqrt(-2.0 * np.log(u1))
        th = (u2 * twopi).astype(np.float32).astype(np.float64)   # one float32 rounding, as §6
        out[:, a] = rad * np.cos(th)
        out[:, b] = rad * np.sin(th)
    return out.reshape(-1)


def test_normal_matches_box_muller():
    n = 1_000_000
    seed, c1, c2, purpose = 2024, 3, 1, repops.PURPOSE_INIT
    z = torch.ops.repops.normal(seed, c1, c2, purpose, n)
    assert z.dtype == torch.float32 and tuple(z.shape) == (n,)
    z = z.numpy().astype(np.float64)
    assert np.all(np.isfinite(z))
    want = box_muller64(philox_op(seed, c1, c2, purpose, n))
    # float32 log/sqrt/sin/cos of §5 vs float64: a few 1e-7 relative, |z| < 6
    diff = np.abs(z - want)
    assert diff.max() < 2e-6, (diff.max(), int(np.argmax(diff)))
    # loose statistics over 10^6 samples (standard errors: 0.001 for mean, 0.0007 for std)
    assert abs(z.mean()) < 0.006
    assert abs(z.std() - 1.0) < 0.005
    assert abs(np.mean(z ** 4) - 3.0) < 0.05                 # kurtosis of a normal
    assert abs(np.mean(np.abs(z) < 1.0) - 0.682689492) < 0.003
    assert np.abs(z).max() < np.sqrt(-2.0 * np.log(2.0 ** -24)) + 1e-5  # largest Box-Muller radius
    # tail length not a multiple of 4: a prefix of the same stream
    z5 = torch.ops.repops.normal(seed, c1, c2, purpose, 5).numpy().astype(np.float64)
    assert np.array_equal(z5, z[:5])
