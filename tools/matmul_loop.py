"""The CPU fp32 matmul (kernels/cpu/matmul.cpp), or the exact matmul (kernels/cpu/exact.cpp),
against another version of itself, in a C++ loop around rp_matmul (rp_exact_matmul): thread CPU
time, no Python and no allocation per call. Both versions are compiled into one program with the
build's flags (the other one against this checkout's headers) and run alternately, product by
product, so that a shared machine's load falls on both alike.

    python -m tools.matmul_loop --against 49f534d             # this checkout's matmul.cpp vs 49f534d's
    python -m tools.matmul_loop --against main --fresh 16     # each call writes one of 16 outputs
    python -m tools.matmul_loop --against main --fresh 16 --operands 16   # and reads one of 16 A, B
    python -m tools.matmul_loop --against main --only gy.T --rounds 21
    python -m tools.matmul_loop --against main --only attn    # attention's six products
    python -m tools.matmul_loop --against main --width 256    # the 256-bit tile (default: this CPU's)
    python -m tools.matmul_loop --width 512 --other_width 256  # this CPU's two tiles, one source
    python -m tools.matmul_loop --kernel exact --against fb70f5c   # exact.cpp against fb70f5c's

The exact matmul's products: the default model's linears and attention's two batched products
(QK^T, PV: 32 heads), A and B^T K-contiguous, and 512^3; both versions call this checkout's int8
GEMM (int8.cpp, int8_amx.cpp: AMX-INT8 where the CPU has it, else the SIMD path). Per product: ms
per call of each version (its best round), this / the other; then the geometric mean.

Products: the default model's 15 linear products (x @ W.T, gy @ W and gy.T @ x of each weight, the
operands laid out as tools/bench.py's, rows = micro_batch_size x seq_len), attention's six batched
products of a layer (q @ k^T, P @ v and the four backward products, each operand in the step's
layout: model.py, repops._MatMul) and 2048^3. Per product: GFLOP/s of each version (its best
round), this / the other (best rounds, and the median of the rounds' ratios); then the geometric
means over the linears and over attention's products, and their fraction of the port limit
(tools/bench.py's: flop per cycle x the clock measured in this process, after the products). The
outputs of both versions are compared bit for bit: a difference prints BITS DIFFER and exits 1.
Needs git and g++. Not a test: run it alone (docs/performance.md; what it measured: dev/LOG.md).
"""
import os
import re
import subprocess
import sys
import tempfile

from config import CommandLine

PROG = "python -m tools.matmul_loop"


def parser():
    ap = CommandLine(PROG, "The CPU fp32 or exact matmul against another version of itself (a git revision), in "
                     "a C++ loop around rp_matmul or rp_exact_matmul, thread CPU time.")
    ap.add_argument("--kernel", choices=("matmul", "exact"), default="matmul",
                    help="kernels/cpu/matmul.cpp (fp32, contract §4.1) or kernels/cpu/exact.cpp (§11) "
                         "(default %(default)s)")
    ap.add_argument("--against", metavar="REV", default="HEAD",
                    help="the git revision whose kernels/cpu/<kernel>.cpp is the other version (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=15, metavar="N",
                    help="alternating rounds of ~15 ms per version and product (default %(default)s)")
    ap.add_argument("--fresh", type=int, default=1, metavar="N",
                    help="outputs each version writes in turn: 1 reuses one (in cache), 16 rotates past L2 "
                         "(default %(default)s)")
    ap.add_argument("--operands", type=int, default=1, metavar="N",
                    help="copies of each product's A and B (the same values) each version reads in turn: 1 "
                         "reads one (in cache), 16 rotates past L2, as in a training step, where each "
                         "product's operands come from other kernels (default %(default)s)")
    ap.add_argument("--only", metavar="TEXT", default="", help="only the products whose name contains TEXT")
    ap.add_argument("--width", type=int, choices=(0, 256, 512), default=0,
                    help="the matmul tile's vector width in both versions (default %(default)s: this CPU's choice)")
    ap.add_argument("--other_width", type=int, choices=(0, 256, 512), default=None, metavar="W",
                    help="the other version's width where it differs from --width (256 or 512)")
    return ap


if __name__ == "__main__":
    parser().answer_early()     # --help and bad input answer here, before torch is imported

import repops  # noqa: E402  (the build's compiler flags)
from config import Config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One program: both versions in their own namespace (their includes are taken first, so the
# namespaces hold only the kernel file's own code); rp_parallel_for runs the whole range on this
# thread. alternate() times them in alternating rounds.
PRELUDE = r"""
#include "kernels.h"
#include "transpose.h"
#include <algorithm>
#include <atomic>
#include <cmath>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <utility>
#include <vector>
void rp_parallel_for(int64_t n, int64_t, void (*fn)(void*, int64_t, int64_t), void* ctx) { if (n > 0) fn(ctx, 0, n); }
int rp_threads() { return 1; }
namespace other {
#include "OTHER"
}
namespace self {
#include "SELF"
}
static double now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
// rounds of `calls` calls of run(v, i), v = 0 (the other version) then 1 (this one): best[v] = the
// best round's seconds per call; returns the median over the rounds of other's time / this one's.
template <class Run>
static double alternate(int rounds, int calls, const Run& run, double best[2]) {
  double last = 0;
  std::vector<double> ratios;
  best[0] = best[1] = 1e30;
  for (int r = 0; r < rounds; ++r)
    for (int v = 0; v < 2; ++v) {
      const double t0 = now();
      for (int i = 0; i < calls; ++i) run(v, i);
      const double t = (now() - t0) / calls;
      best[v] = std::min(best[v], t);
      if (v == 0) last = t; else ratios.push_back(last / t);
    }
  std::sort(ratios.begin(), ratios.end());
  return ratios[ratios.size() / 2];
}
"""

HARNESS = PRELUDE + r"""
struct Product { const char* name; int64_t batch, M, N, K, sab, sam, sak, sbb, sbk, sbn, a_size, b_size; int group; };
static const Product kProducts[] = { PRODUCTS };
int main(int argc, char** argv) {
  const int rounds = atoi(argv[1]), fresh = atoi(argv[2]), width = atoi(argv[3]), other_width = atoi(argv[5]);
  const int operands = atoi(argv[6]);
  const char* only = argv[4];
  if (other::rp_matmul_select(other_width) < 0 || self::rp_matmul_select(width) < 0) {
    fprintf(stderr, "python -m tools.matmul_loop: error: this build has no %d-bit matmul tile\n",
            self::rp_matmul_select(width) < 0 ? width : other_width);
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  // per group (0: the model's linears, 1: attention's products, 2: neither): sums of logs, counts
  double log_other[2] = {}, log_self[2] = {}, log_ratio[2] = {};
  int n_group[2] = {}, differ = 0;
  printf("%-22s %22s %8s %8s %7s %7s\n", "product", "batch x M x N x K", "other", "this", "best", "median");
  for (const Product& p : kProducts) {
    if (!strstr(p.name, only)) continue;
    std::vector<float> A(operands * p.a_size), B(operands * p.b_size);   // copies of one A and one B
    for (int64_t e = 0; e < p.a_size; ++e) A[e] = normal(rng);
    for (int64_t e = 0; e < p.b_size; ++e) B[e] = normal(rng);
    for (int o = 1; o < operands; ++o) {
      std::copy(A.begin(), A.begin() + p.a_size, A.begin() + o * p.a_size);
      std::copy(B.begin(), B.begin() + p.b_size, B.begin() + o * p.b_size);
    }
    const int64_t out = p.batch * p.M * p.N;
    std::vector<float> C[2] = {std::vector<float>(fresh * out), std::vector<float>(fresh * out)};
    const double flop = 2.0 * p.batch * p.M * p.N * p.K;
    const int calls = std::max<int64_t>(1, (int64_t)(1.5e9 / flop));   // ~15 ms at 100 GFLOP/s
    double best[2];
    const double median = alternate(rounds, calls, [&](int v, int i) {
      float* c = C[v].data() + (i % fresh) * out;
      const float *a = A.data() + (i % operands) * p.a_size, *b = B.data() + (i % operands) * p.b_size;
      if (v == 0) other::rp_matmul(a, p.sab, p.sam, p.sak, b, p.sbb, p.sbk, p.sbn, c, p.batch, p.M, p.N, p.K);
      else self::rp_matmul(a, p.sab, p.sam, p.sak, b, p.sbb, p.sbk, p.sbn, c, p.batch, p.M, p.N, p.K);
    }, best);
    const bool same = memcmp(C[0].data(), C[1].data(), C[0].size() * sizeof(float)) == 0;
    differ += !same;
    printf("%-22s %4ldx%5ldx%5ldx%5ld %8.1f %8.1f %6.3fx %6.3fx%s\n", p.name, (long)p.batch, (long)p.M, (long)p.N,
           (long)p.K, flop / best[0] / 1e9, flop / best[1] / 1e9, best[0] / best[1], median, same ? "" : "  BITS DIFFER");
    if (p.group < 2) {
      log_other[p.group] += log(flop / best[0] / 1e9), log_self[p.group] += log(flop / best[1] / 1e9);
      log_ratio[p.group] += log(median), ++n_group[p.group];
    }
  }
  const double hz = self::rp_cpu_clock_hz(), limit = self::rp_matmul_flop_per_cycle() * hz / 1e9;
  if (limit > 0)
    printf("port limit %.1f GFLOP/s (%.0f flop/cycle x %.2f GHz measured)\n", limit, self::rp_matmul_flop_per_cycle(),
           hz / 1e9);
  static const char* const kGroups[2] = {"the model's linears", "attention's products"};
  for (int g = 0; g < 2; ++g) {
    if (!n_group[g]) continue;
    const double g_other = exp(log_other[g] / n_group[g]), g_self = exp(log_self[g] / n_group[g]);
    printf("geometric mean over %s (%d): other %.1f, this %.1f GFLOP/s: this / other %.3fx (median of the rounds' "
           "ratios %.3fx)", kGroups[g], n_group[g], g_other, g_self, g_self / g_other, exp(log_ratio[g] / n_group[g]));
    if (limit > 0) printf("; of the port limit: other %.3f, this %.3f", g_other / limit, g_self / limit);
    printf("\n");
  }
  printf("%s: this %s; other %s\n", differ ? "BITS DIFFER" : "bits equal", self::rp_cpu_path(), other::rp_cpu_path());
  return differ ? 1 : 0;
}
"""


# The exact matmul's program: as HARNESS, around rp_exact_matmul. Both versions' exact.cpp functions
# that kernels.h also declares for the band products are renamed (exact_source), since a call with an
# RpExactOperand argument would otherwise find both (argument-dependent lookup).
HARNESS_EXACT = PRELUDE + r"""
struct Product { const char* name; int64_t batch, M, N, K; };
static const Product kProducts[] = { PRODUCTS };
int main(int argc, char** argv) {
  const int rounds = atoi(argv[1]), fresh = atoi(argv[2]), operands = atoi(argv[4]);
  const char* only = argv[3];
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  double log_ratio = 0;
  int n = 0, differ = 0;
  printf("%-16s %22s %9s %9s %7s %7s\n", "product", "batch x M x N x K", "other ms", "this ms", "best", "median");
  for (const Product& p : kProducts) {
    if (!strstr(p.name, only)) continue;
    const int64_t out = p.batch * p.M * p.N;
    const int64_t a_size = p.batch * p.M * p.K, b_size = p.batch * p.N * p.K;
    std::vector<float> A(operands * a_size), B(operands * b_size);   // A [batch, M, K], B^T [batch, N, K]; copies
    for (int64_t e = 0; e < a_size; ++e) A[e] = normal(rng);
    for (int64_t e = 0; e < b_size; ++e) B[e] = normal(rng);
    for (int o = 1; o < operands; ++o) {
      std::copy(A.begin(), A.begin() + a_size, A.begin() + o * a_size);
      std::copy(B.begin(), B.begin() + b_size, B.begin() + o * b_size);
    }
    std::vector<float> C[2] = {std::vector<float>(fresh * out), std::vector<float>(fresh * out)};
    const int calls = std::max<int64_t>(1, (int64_t)(2.5e8 / ((double)p.batch * p.M * p.N * p.K)));   // ~10-20 ms
    double best[2];
    const double median = alternate(rounds, calls, [&](int v, int i) {
      for (int64_t b = 0; b < p.batch; ++b) {
        const RpExactOperand a{A.data() + (i % operands) * a_size + b * p.M * p.K, p.K, 1},
            bt{B.data() + (i % operands) * b_size + b * p.N * p.K, p.K, 1};
        float* c = C[v].data() + (i % fresh) * out + b * p.M * p.N;
        if (v == 0) other::rp_exact_matmul(a, bt, c, p.M, p.N, p.K);
        else self::rp_exact_matmul(a, bt, c, p.M, p.N, p.K);
      }
    }, best);
    const bool same = memcmp(C[0].data(), C[1].data(), C[0].size() * sizeof(float)) == 0;
    differ += !same;
    printf("%-16s %4ldx%5ldx%5ldx%5ld %9.3f %9.3f %6.3fx %6.3fx%s\n", p.name, (long)p.batch, (long)p.M, (long)p.N,
           (long)p.K, best[0] * 1e3, best[1] * 1e3, best[0] / best[1], median, same ? "" : "  BITS DIFFER");
    log_ratio += log(best[0] / best[1]), ++n;
  }
  if (n) printf("geometric mean this / other speed %.3fx\n", exp(log_ratio / n));
  printf("%s; the residue GEMMs: %s\n", differ ? "BITS DIFFER" : "bits equal", rp_int8_path());
  return differ ? 1 : 0;
}
"""


def exact_products():
    """The C++ initializer of the exact matmul's products (name, batch, M, N, K): the default model's
    linears (x @ W.T, gy @ W and gy.T @ x of each weight), attention's QK^T and PV, and 512^3."""
    cfg, vocab = Config(), 256
    d, h, rows, T = cfg.d_model, cfg.d_hidden, cfg.micro_batch_size * cfg.seq_len, cfg.seq_len
    dh, heads = d // cfg.n_head, cfg.micro_batch_size * cfg.n_head
    qkv = (cfg.n_head + 2 * (cfg.n_kv_head or cfg.n_head)) * dh
    out = []
    for name, (out_f, in_f) in {"wqkv": (qkv, d), "wo": (d, d), "w_gate_up": (2 * h, d), "w_down": (d, h),
                                "lm_head": (vocab, d)}.items():
        out += [(f"{name} x@W.T", 1, rows, out_f, in_f), (f"{name} gy@W", 1, rows, in_f, out_f),
                (f"{name} gy.T@x", 1, out_f, in_f, rows)]
    out += [("QK^T", heads, T, T, dh), ("PV", heads, T, dh, T), ("512^3", 1, 512, 512, 512)]
    return ", ".join("{" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in r) + "}" for r in out)


def exact_source(text):
    """exact.cpp with rp_exact_product, rp_exact_exponents and rp_exact_beta renamed (HARNESS_EXACT)."""
    return re.sub(r"\brp_exact_(product|exponents|beta)\b", r"loop_exact_\1", text)


def products():
    """The C++ initializer of the products (name, batch, M, N, K, A's batch, row and k strides, B's
    batch, k and column strides, element counts of A and B, group): the default model's 15 linear
    products (group 0), attention's six batched products per layer (group 1) and 2048^3 (group 2)."""
    cfg, vocab = Config(), 256     # the default corpus's vocabulary (python data.py)
    d, h, rows = cfg.d_model, cfg.d_hidden, cfg.micro_batch_size * cfg.seq_len
    dh, T = d // cfg.n_head, cfg.seq_len
    kv = cfg.n_kv_head or cfg.n_head
    qkv = (cfg.n_head + 2 * kv) * dh
    out = []
    for name, (out_f, in_f) in {"wqkv": (qkv, d), "wo": (d, d), "w_gate_up": (2 * h, d), "w_down": (d, h),
                                "lm_head": (vocab, d)}.items():
        # x [rows, in], W [out, in], gy [rows, out], all contiguous; the views as tools/bench.py's
        out += [(f"{name} x@W.T", 1, rows, out_f, in_f, 0, in_f, 1, 0, 1, in_f, rows * in_f, out_f * in_f, 0),
                (f"{name} gy@W", 1, rows, in_f, out_f, 0, out_f, 1, 0, in_f, 1, rows * out_f, out_f * in_f, 0),
                (f"{name} gy.T@x", 1, out_f, in_f, rows, 0, 1, out_f, 0, in_f, 1, rows * out_f, rows * in_f, 0)]
    # attention (model.py, repops._MatMul's backward): q, k, v, gO [b, R, dh] and P, gS [b, R, T]
    # contiguous, b = micro_batch_size x kv heads, R = T x the query heads per kv head
    b, r = cfg.micro_batch_size * kv, T * (cfg.n_head // kv)
    qs, ps = r * dh, r * T                     # batch strides of q (gO) and of P (gS)
    ks = T * dh                                # of k and v
    out += [("attn q@k.T", b, r, T, dh, qs, dh, 1, ks, 1, dh, b * qs, b * ks, 1),
            ("attn P@v", b, r, dh, T, ps, T, 1, ks, dh, 1, b * ps, b * ks, 1),
            ("attn gO@v.T", b, r, T, dh, qs, dh, 1, ks, 1, dh, b * qs, b * ks, 1),
            ("attn P.T@gO", b, T, dh, r, ps, 1, T, qs, dh, 1, b * ps, b * qs, 1),
            ("attn gS@k", b, r, dh, T, ps, T, 1, ks, dh, 1, b * ps, b * ks, 1),
            ("attn gS.T@q", b, T, dh, r, ps, 1, T, qs, dh, 1, b * ps, b * qs, 1)]
    n = 2048
    out.append(("square x@W.T", 1, n, n, n, 0, n, 1, 0, 1, n, n * n, n * n, 2))
    return ", ".join("{" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in row) + "}" for row in out)


def fail(message):
    """Bad input, or a missing tool: one line and exit 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    args = parser().parse_args()
    if args.rounds < 1 or args.fresh < 1 or args.operands < 1:
        fail("--rounds, --fresh and --operands must be at least 1")
    exact = args.kernel == "exact"
    if exact and (args.width or args.other_width is not None):
        fail("--width and --other_width choose the fp32 matmul's tile: not with --kernel exact")
    name = f"kernels/cpu/{args.kernel}.cpp"
    cpu = os.path.join(ROOT, "kernels", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        other, this = os.path.join(tmp, "other.cpp"), os.path.join(tmp, "this.cpp")
        shown = subprocess.run(["git", "show", f"{args.against}:{name}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode != 0:
            fail(f"git show {args.against}:{name}: {(shown.stderr.strip().splitlines() or ['failed'])[0]}")
        with open(os.path.join(ROOT, name)) as f:
            current = f.read()
        for path, text in ((other, shown.stdout), (this, current)):
            with open(path, "w") as f:
                f.write(exact_source(text) if exact else text)
        source, program = os.path.join(tmp, "loop.cpp"), os.path.join(tmp, "loop")
        with open(source, "w") as f:
            f.write((HARNESS_EXACT if exact else HARNESS).replace("OTHER", other).replace("SELF", this)
                    .replace("PRODUCTS", exact_products() if exact else products()))
        # the exact matmul's residue GEMMs: this checkout's int8 GEMM, shared by both versions
        linked = [os.path.join(cpu, "int8.cpp"), os.path.join(cpu, "int8_amx.cpp")] if exact else []
        cxx = os.environ.get("CXX", "g++")
        try:
            built = subprocess.run([cxx, *repops.CPU_FLAGS, "-I", cpu, "-I", os.path.join(ROOT, "kernels", "common"),
                                    source, *linked, "-o", program], capture_output=True, text=True)
        except FileNotFoundError:
            fail(f"no C++ compiler {cxx!r} (set CXX)")
        if built.returncode != 0:
            fail(f"{cxx} could not build the two versions together: "
                 f"{(built.stderr.strip().splitlines() or ['failed'])[0]}")
        print(f"this checkout's {name} against {args.against}'s; thread CPU time, best of {args.rounds} "
              f"alternating rounds, {args.fresh} output(s) and {args.operands} copies of the operands per version; "
              f"{'ms per call' if exact else 'GFLOP/s'}",
              flush=True)
        if exact:
            command = [program, str(args.rounds), str(args.fresh), args.only, str(args.operands)]
        else:
            command = [program, str(args.rounds), str(args.fresh), str(args.width), args.only,
                       str(args.width if args.other_width is None else args.other_width), str(args.operands)]
        sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
