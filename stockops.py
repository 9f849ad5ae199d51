"""Stock PyTorch operators under the contract: each ATen operator that models are written with,
computed as a composition of RepOps kernels, with the bits kernels/README.md §12 defines.

guard.py's dispatch mode runs every operator of MAPPED this way while it is active (a step of a
model that uses them, its evaluation and its sampling), so that stock code gets the same bits on
every CPU, GPU and rank count:

    import guard
    with guard.ContractMode(seed=1337, step=1, micro=0):
        y = torch.nn.functional.gelu(x) * up          # repops kernels: contract §12's bits
        loss = torch.nn.functional.cross_entropy(logits, targets)
        loss.backward()                               # gelu_backward, mul, ... mapped too

Why a dispatch mode (torch.utils._python_dispatch) and not torch.library overrides: a mode sits
below autograd, so F.gelu(x) records GeluBackward0 as usual and the backward operators that
autograd runs (aten::gelu_backward, and autograd's own sums of gradient contributions,
aten::add) reach it too; it is scoped to what runs inside it (a step), with no process-wide
side effect, where an override replaces a kernel for every dtype and every caller in the
process and cannot refuse the operators nobody mapped.

A mapping receives the operator's arguments as the dispatcher passes them (any strides,
broadcastable shapes, Python numbers) and returns what the operator returns. Data movement
(broadcast, permute, reshape, contiguous copies) and selections (where, comparisons on
DAZ-read values, the index of a maximum) stay in torch: they compute no new value. Every float
value it computes comes from a RepOps kernel: repops.ops.<name>, CPU, CUDA and Metal alike.
A form the contract does not define (float64, alpha = 2 on a matmul, class weights in
nll_loss) raises Unmapped, which the guard turns into its refusal line. A mapping returns PASS
where the operator does no float arithmetic at all (integer arithmetic, exact): the guard then
runs torch's own.
"""
import math

import torch

import repops
from repops import f32, ops

# Integer and bool types whose every value converts to float32 exactly.
EXACT_TO_F32 = (torch.bool, torch.uint8, torch.int8, torch.int16)
# Stock Philox streams (contract §12.7): counter word c1 of a dropout mask is step + DROPOUT_C1
# (model.py's own dropout has c1 = step < 2^31, so the two never meet); init draws have c1 =
# INIT_C1 (model.py's canonical init has c1 = 0).
DROPOUT_C1 = 1 << 31
INIT_C1 = 1
F32_ONLY = "keep the model float32, without autocast (contract §1)"


class Unmapped(Exception):
    """A form of an operator that the contract does not define; `instead` says what to write."""

    def __init__(self, form, instead=None):
        super().__init__(form)
        self.form, self.instead = form, instead


PASS = object()       # returned by a mapping whose operands are all integers: torch's own op is exact


# ------------------------------------------------------------------ operands
def _is_float(x):
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def _dtype(t):
    return str(t.dtype).removeprefix("torch.")


def _check_f32(*tensors):
    """Unmapped unless every floating tensor among `tensors` is float32 (None and others pass)."""
    for t in tensors:
        if _is_float(t) and t.dtype != torch.float32:
            raise Unmapped(f"on {_dtype(t)}", F32_ONLY)


def _computes_f32(*operands):
    """True where the operator computes a float32 result from these operands (map it); False where
    none is floating (integer or bool arithmetic, exact: PASS); Unmapped for another float dtype."""
    if not any(_is_float(x) or isinstance(x, float) for x in operands):
        return False
    _check_f32(*operands)
    return True


def fits_f32(x):
    """Does converting the bool or integer tensor x to float32 keep every value? Always for a bool
    or at most 16 bits; for a wider integer where all its values lie in [-2^24, 2^24], read on the
    host (-2^63 and -2^31, whose abs() wraps, are powers of two: float32 holds them too)."""
    return x.dtype in EXACT_TO_F32 or x.numel() == 0 or int(x.abs().max()) <= 1 << 24


def _as_f32(x, like):
    """Operand x of a float32 result as a float32 tensor on like's device: a float32 tensor as it
    is, a bool or integer tensor converted where that is exact (a bool or at most 16 bits; a wider
    integer whose values all lie in [-2^24, 2^24], read on the host: e.g. the count of tied
    maxima that amax's backward divides by), a Python number rounded once, f32(x)."""
    if not isinstance(x, torch.Tensor):
        return torch.tensor(f32(float(x)), device=like.device)
    if x.dtype == torch.float32:
        return x
    _check_f32(x)
    if fits_f32(x):
        return x.to(torch.float32)
    raise Unmapped(f"with a {_dtype(x)} operand beyond 2^24", "keep the arithmetic in integers, or its values within 2^24")


def _const(value, like):
    """The float32 constant f32(value), broadcast to like's shape (a view: no values computed)."""
    return torch.full((), f32(value), device=like.device).expand(like.shape)


def _zero(like):
    return torch.zeros((), device=like.device)


def _daz(x):
    """x with every subnormal and zero read as +0.0 (contract §3), decided by its exponent bits: the
    same on every device (an Apple GPU flushes subnormals in hardware, CPUs and CUDA do not). For
    the comparisons of selections, where the sign of a zero decides nothing."""
    return torch.where((x.view(torch.int32) & 0x7F800000) == 0, _zero(x), x)


def _daz_nan_low(x):
    """_daz(x) with NaN read as -inf: the terms of the canonical maximum."""
    x = _daz(x)
    return torch.where(torch.isnan(x), torch.full((), -math.inf, device=x.device), x)


# ------------------------------------------------------------------ elementwise (contract §12.1)
def _add(a, b):
    return ops.add(*torch.broadcast_tensors(a, b))


def _mul(a, b):
    return ops.mul(*torch.broadcast_tensors(a, b))


def _neg(x):
    return ops.scale(x, -1.0)


def _sub(a, b):
    """a - b as a + (-b): the IEEE difference, one rounding."""
    return _add(a, _neg(b))


def add(self, other, alpha=1):
    """self + alpha * other. alpha 1: one add. A Python number other: self + f32(alpha * other).
    alpha -1: self + (-other). Any other alpha: self + (other * f32(alpha))."""
    if not _computes_f32(self, other):
        return PASS
    if not isinstance(other, torch.Tensor):
        return _add(_as_f32(self, self), _as_f32(float(other) * float(alpha), self))
    a, b = _as_f32(self, other), _as_f32(other, self)
    if alpha == 1:
        return _add(a, b)
    if alpha == -1:
        return _sub(a, b)
    return _add(a, ops.scale(b, f32(float(alpha))))


def sub(self, other, alpha=1):
    """self - alpha * other: add(self, other, -alpha)."""
    return add(self, other, -alpha)


def rsub(self, other, alpha=1):
    """other - alpha * self."""
    if not _computes_f32(self, other):
        return PASS
    return add(_as_f32(other, self), self, -alpha)


def mul(self, other):
    """One multiply; by a Python number s: self * f32(s)."""
    if not _computes_f32(self, other):
        return PASS
    if not isinstance(other, torch.Tensor):
        return ops.scale(_as_f32(self, self), f32(float(other)))
    return _mul(_as_f32(self, other), _as_f32(other, self))


def div(self, other, *, rounding_mode=None):
    """self * recip(other); by a Python number s: self * f32(1 / s) (contract §1's host scalar;
    s = 0 multiplies by an infinity of its sign)."""
    if rounding_mode is not None:
        if not _computes_f32(self, other):
            return PASS
        raise Unmapped(f"with rounding_mode={rounding_mode!r}", "compose it from the mapped operators")
    if not _computes_f32(self, other):
        raise Unmapped("on integers (a true division rounds)", "convert them to float32 where that is exact")
    if not isinstance(other, torch.Tensor):
        s = float(other)
        return ops.scale(_as_f32(self, self), f32(1.0 / s) if s else math.copysign(math.inf, s))
    return _mul(_as_f32(self, other), ops.recip(_as_f32(other, self)))


def _unary(kernel):
    """A float32-only elementwise function computed by `kernel`."""
    def mapped(self):
        if not _computes_f32(self):
            raise Unmapped("on integers", "convert them to float32 where that is exact")
        return kernel(self)
    mapped.__doc__ = kernel.__doc__
    return mapped


def _kernel(name):
    """repops.ops.<name> (the kernels load on first use)."""
    def call(x):
        return getattr(ops, name)(x)
    call.__doc__ = f"The canonical {name} kernel (contract §5)."
    return call


def neg(self):
    """x * -1.0 (contract §8 scale: exact; a subnormal reads as zero)."""
    return _neg(self) if _computes_f32(self) else PASS


def sigmoid(x):
    """Contract §5.6: recip(1.0 + exp(-x)), one kernel."""
    return ops.sigmoid(x)


def silu(x):
    """Contract §5.6: x * sigmoid(x)."""
    return _mul(x, ops.sigmoid(x))


def gelu(self, *, approximate="none"):
    """gelu (the erf form) or, with approximate='tanh', gelu_tanh: one kernel each (contract §5)."""
    if approximate not in ("none", "tanh"):
        raise Unmapped(f"with approximate={approximate!r}")
    return _unary(ops.gelu if approximate == "none" else ops.gelu_tanh)(self)


def relu(self):
    """(daz(x) <= 0) ? +0.0 : x, a selection (NaN stays NaN)."""
    if not _computes_f32(self):
        return PASS
    return torch.where(_daz(self) <= 0, _zero(self), self).contiguous()


def absolute(self):
    """x with its sign bit cleared (exact; a subnormal stays)."""
    if not _computes_f32(self):
        return PASS
    return (self.contiguous().view(torch.int32) & 0x7FFFFFFF).view(torch.float32)


def sign(self):
    """+1.0 where daz(x) > 0, -1.0 where daz(x) < 0, +0.0 elsewhere (zeros, subnormals, NaN)."""
    if not _computes_f32(self):
        return PASS
    x, one = _daz(self), torch.ones((), device=self.device)
    return torch.where(x > 0, one, torch.where(x < 0, -one, _zero(x))).contiguous()


def powi(x, n):
    """x^n for an integer n >= 1 by binary exponentiation (contract §12.1): over the bits of n from
    the lowest, a set bit multiplies the result by the current power (the first set bit takes the
    power as it is), and the power is squared while higher bits remain."""
    result, power = None, x
    while n:
        if n & 1:
            result = power if result is None else ops.mul(result, power)
        n >>= 1
        if n:
            power = ops.mul(power, power)
    return result


def power(self, exponent):
    """x^e: 0.5 sqrt, -0.5 rsqrt, 0 the constant 1.0, 1 a copy, an integer n >= 2 powi(x, n), -1
    recip, n <= -2 recip(powi(x, -n)); any other exponent is refused."""
    if not _computes_f32(self, exponent):
        return PASS
    e = float(exponent)
    if e == 0.5:
        return ops.sqrt(self)
    if e == -0.5:
        return ops.rsqrt(self)
    if not (e == int(e) and abs(e) < 2 ** 31):
        raise Unmapped(f"with exponent {exponent}", "use an integer exponent, 0.5 (sqrt) or -0.5 (rsqrt)")
    n, x = int(e), self.contiguous()
    if n == 0:
        return torch.ones(self.shape, device=self.device)
    if n == 1:
        return x.clone()
    return powi(x, n) if n > 0 else ops.recip(powi(x, -n))


# The backward operators of the activations: g times the derivative (contract §12.1).
def tanh_backward(grad_output, output):
    """g * (1.0 - y * y)."""
    _check_f32(grad_output, output)
    return _mul(grad_output, _sub(_const(1.0, output), _mul(output, output)))


def sigmoid_backward(grad_output, output):
    """g * (y * (1.0 - y))."""
    _check_f32(grad_output, output)
    return _mul(grad_output, _mul(output, _sub(_const(1.0, output), output)))


def silu_backward(grad_output, self):
    """g * (s * (1.0 + (x * (1.0 - s)))) with s = sigmoid(x): swiglu's silu factor (contract §8)."""
    _check_f32(grad_output, self)
    s = sigmoid(self)
    return _mul(grad_output, _mul(s, _add(_const(1.0, s), _mul(self, _sub(_const(1.0, s), s)))))


def gelu_backward(grad_output, self, *, approximate="none"):
    """g * gelu_grad(x) (approximate='tanh': gelu_tanh_grad(x)): one multiply."""
    _check_f32(grad_output, self)
    if approximate not in ("none", "tanh"):
        raise Unmapped(f"with approximate={approximate!r}")
    return _mul(grad_output, (ops.gelu_grad if approximate == "none" else ops.gelu_tanh_grad)(self))


def threshold_backward(grad_output, self, threshold):
    """(daz(x) <= f32(threshold)) ? +0.0 : g (relu's backward), a selection."""
    _check_f32(grad_output, self)
    g, zeroed = torch.broadcast_tensors(grad_output, _daz(self) <= f32(float(threshold)))
    return torch.where(zeroed, _zero(g), g).contiguous()


# ------------------------------------------------------------------ reductions (contract §12.2)
def _rows(x, dim):
    """(rows [R, n], n, the output's shape, its keepdim shape): x's reduced dims (all of them for
    None or []) moved last in increasing order and flattened row-major (a copy: data movement)."""
    nd = x.dim()
    dims = sorted({d % nd for d in dim}) if dim and nd else list(range(nd))
    kept = [d for d in range(nd) if d not in dims]
    n = math.prod(x.shape[d] for d in dims)
    out = [x.shape[d] for d in kept]
    keep_shape = [1 if d in dims else x.shape[d] for d in range(nd)]
    return x.permute(kept + dims).reshape(math.prod(out), n), n, out, keep_shape


def _float32_dtype(dtype):
    if dtype is not None and dtype != torch.float32:
        raise Unmapped(f"with dtype={dtype}", F32_ONLY)


def _csum(rows, n):
    return ops.csum(rows) if n else torch.zeros(rows.shape[0], device=rows.device)


def reduce_sum(self, dim=None, keepdim=False, *, dtype=None):
    """Each output the canonical sum (contract §4.2) of its terms in row-major order."""
    if not _computes_f32(self):
        return PASS
    _float32_dtype(dtype)
    rows, n, out, keep_shape = _rows(self, dim)
    return _csum(rows, n).view(keep_shape if keepdim else out)


def reduce_mean(self, dim=None, keepdim=False, *, dtype=None):
    """sum * f32(1/n), n the terms of each output."""
    if not _computes_f32(self):
        raise Unmapped("on integers", "convert them to float32 where that is exact")
    _float32_dtype(dtype)
    rows, n, out, keep_shape = _rows(self, dim)
    return ops.scale(_csum(rows, n), f32(1.0 / n) if n else math.nan).view(keep_shape if keepdim else out)


def _max_rows(rows):
    """Each row's canonical maximum (contract §12.2): the largest DAZ-read term, NaN terms skipped
    (-inf where none is left); a zero is +0.0. A selection (torch.amax) among terms whose order
    can no longer decide anything: no subnormal, no NaN, one zero."""
    return torch.amax(_daz_nan_low(rows), dim=-1)


def reduce_amax(self, dim=(), keepdim=False):
    if not _computes_f32(self):
        return PASS
    rows, n, out, keep_shape = _rows(self, list(dim))
    if n == 0:
        raise Unmapped("over no elements")
    return _max_rows(rows).view(keep_shape if keepdim else out)


def reduce_max(self, dim=None, keepdim=False):
    """max(x): as amax over every dim. max(x, dim): (values as amax, the index of the first term
    whose DAZ-read value (NaN read as -inf) equals it)."""
    if not _computes_f32(self):
        return PASS
    if dim is None:
        return reduce_amax(self)
    values = reduce_amax(self, [dim], keepdim=True)
    indices = torch.argmax((_daz_nan_low(self) == values).to(torch.uint8), dim=dim, keepdim=True)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


# ------------------------------------------------------------------ softmax and the losses (contract §12.3)
def _last(x, dim):
    """(x with `dim` moved last as contiguous rows [R, n], the moved shape)."""
    moved = x.movedim(dim, -1) if x.dim() else x.reshape(1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape


def _back(rows, moved_shape, dim, like):
    """Rows [R, n] back in like's shape and layout order (dim where it was), contiguous."""
    return rows.view(moved_shape).movedim(-1, dim).contiguous() if like.dim() else rows.view(())


def _shifted_exp(z):
    """(m, e) of rows z [R, n]: m [R, 1] their canonical max, e_j = exp(z_j - m) (as z_j + (-m))."""
    m = _max_rows(z).unsqueeze(-1)
    return m, ops.exp(_add(z, _neg(m)))


def softmax(self, dim, half_to_float=False):
    """causal_softmax's row formula with every column a term, scale 1 (contract §12.3):
    m = cmax(z); e_j = exp(z_j - m); P_j = e_j * recip(csum(e))."""
    _check_f32(self)
    if half_to_float:
        raise Unmapped("with half_to_float", F32_ONLY)
    z, shape = _last(self, dim)
    _, e = _shifted_exp(z)
    return _back(_mul(e, ops.recip(ops.csum(e)).unsqueeze(-1)), shape, dim, self)


def log_softmax(self, dim, half_to_float=False):
    """y_j = z_j - lse with lse = m + log(csum(exp(z_j - m))): cross_entropy's lse (contract §8)."""
    _check_f32(self)
    if half_to_float:
        raise Unmapped("with half_to_float", F32_ONLY)
    z, shape = _last(self, dim)
    m, e = _shifted_exp(z)
    lse = ops.add(m.view(-1), ops.log(ops.csum(e))).unsqueeze(-1)
    return _back(_sub(z, lse), shape, dim, self)


def softmax_backward(grad_output, output, dim, input_dtype):
    """dot = csum_j(P_j * gP_j); gz_j = (gP_j - dot) * P_j: causal_softmax's backward, scale 1."""
    _check_f32(grad_output, output)
    g, shape = _last(grad_output, dim)
    p, _ = _last(output, dim)
    dot = ops.csum(ops.mul(p, g)).unsqueeze(-1)
    return _back(ops.mul(_sub(g, dot), p), shape, dim, grad_output)


def log_softmax_backward(grad_output, output, dim, input_dtype):
    """s = csum_j(g_j); gz_j = g_j - (exp(y_j) * s)."""
    _check_f32(grad_output, output)
    g, shape = _last(grad_output, dim)
    y, _ = _last(output, dim)
    return _back(_sub(g, _mul(ops.exp(y), ops.csum(g).unsqueeze(-1))), shape, dim, grad_output)


NLL_REDUCTIONS = ("none", "mean", "sum")    # torch's reduction enum: 0, 1, 2


def _nll_rows(x, target, weight, ignore_index):
    """(x as [N, C], the targets [N] with 0 where ignored, kept [N] bool, count: the kept rows,
    read on the host)."""
    _check_f32(x)
    if weight is not None:
        raise Unmapped("with class weights", "weight the per-row losses (reduction='none') with mapped operators")
    x2 = x.unsqueeze(0) if x.dim() == 1 else x
    t = target.reshape(-1)
    kept = t != ignore_index
    t = torch.where(kept, t, torch.zeros((), dtype=t.dtype, device=t.device))
    return x2, t, kept, int(kept.sum())


def nll_loss_forward(self, target, weight, reduction, ignore_index):
    """l_r = -x[r, t_r] over the rows r of x [N, C], +0.0 where t_r == ignore_index. none: l;
    sum: csum_r(l_r) (an ignored row is a +0.0 term); mean: that sum * f32(1/count), count the
    rows not ignored. total_weight = float(count)."""
    x2, t, kept, count = _nll_rows(self, target, weight, ignore_index)
    if bool(((t < 0) | (t >= x2.shape[1])).any()):
        raise Unmapped("with a target out of range")
    picked = x2.gather(1, t.unsqueeze(1)).squeeze(1)
    losses = torch.where(kept, _neg(picked), _zero(picked))
    total = torch.tensor(float(count), device=self.device)
    how = NLL_REDUCTIONS[reduction]
    if how == "none":
        return losses.view(target.shape), total
    s = ops.csum(losses.view(1, -1)).view(())
    if how == "sum":
        return s, total
    return ops.scale(s, f32(1.0 / count) if count else math.nan), total


def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    """gx[r, t_r] = -gs_r for every row not ignored, +0.0 everywhere else: gs = g * f32(1/count)
    (mean), g (sum), g_r (none)."""
    _check_f32(grad_output)
    x2, t, kept, count = _nll_rows(self, target, weight, ignore_index)
    g = grad_output.reshape(-1)
    if NLL_REDUCTIONS[reduction] == "mean":
        g = ops.scale(g, f32(1.0 / count) if count else math.nan)
    values = torch.where(kept, _neg(g).expand(t.shape[0]), _zero(g))
    return torch.zeros(x2.shape, device=self.device).scatter_(1, t.unsqueeze(1), values.unsqueeze(1)).view(self.shape)


# ------------------------------------------------------------------ layer norm (contract §12.4)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """Per row of D = prod(normalized_shape) terms, inv_d = f32(1/D): mean = csum(x) * inv_d;
    c_j = x_j - mean; var = csum(c_j * c_j) * inv_d; rstd = rsqrt(var + f32(eps));
    h_j = c_j * rstd; y_j = (h_j * w_j) + b_j (without a weight h_j; without a bias no add).
    Returns (y, mean, rstd), the statistics shaped [..., 1, ...] as torch's."""
    _check_f32(input, weight, bias)
    d = math.prod(normalized_shape)
    x, inv_d = input.reshape(-1, d), f32(1.0 / d)
    mu = ops.scale(ops.csum(x), inv_d).unsqueeze(-1)
    c = _sub(x, mu)
    rstd = ops.rsqrt(ops.add(ops.scale(ops.csum(ops.mul(c, c)), inv_d), _const(eps, mu.view(-1)))).unsqueeze(-1)
    y = _mul(c, rstd)
    y = y if weight is None else _mul(y, weight.reshape(1, d))
    y = y if bias is None else _add(y, bias.reshape(1, d))
    stats = list(input.shape[:input.dim() - len(normalized_shape)]) + [1] * len(normalized_shape)
    return y.view(input.shape), mu.view(stats), rstd.view(stats)


def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """h_j = (x_j - mean) * rstd (the forward's h, again); gb_j = csum_r(g[r,j]) and
    gw_j = csum_r(g[r,j] * h[r,j]) (sums over rows, contract §4.2); a_j = g_j * w_j (g_j without
    a weight); s1 = csum_j(a_j) * inv_d; s2 = csum_j(a_j * h_j) * inv_d;
    gx_j = ((a_j - s1) - (h_j * s2)) * rstd."""
    _check_f32(grad_out, input, weight, bias)
    d = math.prod(normalized_shape)
    x, g, inv_d = input.reshape(-1, d), grad_out.reshape(-1, d), f32(1.0 / d)
    rs = rstd.reshape(-1, 1)
    h = _mul(_sub(x, mean.reshape(-1, 1)), rs)
    gx = gw = gb = None
    if output_mask[0]:
        a = g if weight is None else _mul(g, weight.reshape(1, d))
        s1 = ops.scale(ops.csum(a), inv_d).unsqueeze(-1)
        s2 = ops.scale(ops.csum(ops.mul(a, h)), inv_d).unsqueeze(-1)
        gx = _mul(_sub(_sub(a, s1), _mul(h, s2)), rs).view(input.shape)
    if output_mask[1] and weight is not None:
        gw = ops.csum(_mul(g, h).t()).view(weight.shape)
    if output_mask[2] and bias is not None:
        gb = ops.csum(g.t()).view(bias.shape)
    return gx, gw, gb


# ------------------------------------------------------------------ matmul (contract §12.5)
def _matmul(mode, a, b):
    _check_f32(a, b)
    return (ops.exact_matmul if mode.exact else ops.matmul)(a, b)


def mm(mode, self, mat2):
    """mm, bmm: the contract's matmul (§4.1; §11 with the run's matmul = exact)."""
    return _matmul(mode, self, mat2)


def mv(mode, self, vec):
    return _matmul(mode, self, vec.unsqueeze(-1)).squeeze(-1)


def dot(mode, self, tensor):
    return _matmul(mode, self.unsqueeze(0), tensor.unsqueeze(-1)).view(())


def addmm(mode, self, mat1, mat2, *, beta=1, alpha=1):
    """addmm, baddbmm: (mat1 @ mat2) + bias, the matmul then one add (beta = alpha = 1 only)."""
    if beta != 1 or alpha != 1:
        raise Unmapped(f"with beta={beta}, alpha={alpha}", "scale the product with mapped operators")
    _check_f32(self)
    return _add(_matmul(mode, mat1, mat2), self)


# ------------------------------------------------------------------ selections (contract §12.6)
def _comparison(op):
    def mapped(self, other):
        """A comparison of the DAZ-read operands (a Python number rounded once, f32)."""
        if not _computes_f32(self, other):
            return PASS
        return op(_daz(_as_f32(self, self)), _daz(_as_f32(other, self)))
    return mapped


def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """repops embedding_backward (contract §4.3: row v the sequential sum, in position order, of
    the gradients of the positions reading v; +0.0 where none does); the padding row +0.0."""
    _check_f32(grad_output)
    if scale_grad_by_freq:
        raise Unmapped("with scale_grad_by_freq", "scale the gradient with mapped operators")
    d = grad_output.shape[-1]
    gw = ops.embedding_backward(grad_output.reshape(-1, d), indices.reshape(-1), num_weights, True)
    if padding_idx >= 0:
        gw[padding_idx] = 0.0
    return gw


# ------------------------------------------------------------------ random numbers (contract §12.7)
def _keep_mask(mode, shape, keep, device):
    """The keep mask of this micro-batch's next dropout site, and the site's counter words (c1, c2):
    element i is kept iff Philox word i of counter (i/4, c1 = step + 2^31, c2 = (micro << 16) | site,
    DROPOUT) under the run's seed is below round(keep * 2^32) (clamped to 2^32 - 1)."""
    c1, c2 = mode.dropout_counters()
    words = repops.philox_words(mode.seed, c1, c2, repops.PURPOSE_DROPOUT, math.prod(shape))
    return (words < min(round(keep * 2.0 ** 32), 2 ** 32 - 1)).view(shape).to(device), (c1, c2)


def native_dropout(mode, input, p, train):
    """(x * f32(1/(1-p)) where kept, x * 0.0 where dropped; the keep mask): repops dropout (contract
    §6) at the site's counters."""
    _check_f32(input)
    if not train or p == 0:
        return input.clone(), torch.ones(input.shape, dtype=torch.bool, device=input.device)
    if not 0 < p < 1:
        raise Unmapped(f"with p={p}", "use 0 <= p < 1")
    keep, (c1, c2) = _keep_mask(mode, input.shape, 1.0 - p, input.device)
    return ops.dropout(input, p, repops._signed64(mode.seed), c1, c2), keep


def native_dropout_backward(grad_output, mask, scale):
    """g * (mask ? f32(scale) : 0.0): the forward's mask and scale on the gradient."""
    _check_f32(grad_output)
    factor = torch.where(mask, torch.full((), f32(scale), device=mask.device), _zero(grad_output))
    return _mul(grad_output, factor)


def bernoulli_(mode, self, p=0.5, *, generator=None):
    """self[i] = 1.0 where the site's word i is below round(p * 2^32), else +0.0: F.dropout's CPU
    form, a keep mask with p = 1 - dropout, then x * (mask / (1 - dropout))."""
    _check_f32(self)
    if generator is not None:
        raise Unmapped("with a torch.Generator", "the contract keys random numbers itself (Philox)")
    keep, _ = _keep_mask(mode, self.shape, float(p), self.device)
    return self.copy_(keep)


def normal_(mode, self, mean=0.0, std=1.0, *, generator=None):
    """An initialization draw (contract §12.7): z = normal(seed, c1 = 1, c2 = the draw's ordinal,
    INIT) row-major; self = z * f32(std), then + f32(mean) unless mean is 0."""
    _check_f32(self)
    x = ops.scale(repops.normal(mode.seed, INIT_C1, mode.init_draw(), repops.PURPOSE_INIT, self.numel()), f32(std))
    return self.copy_((x if mean == 0 else _add(x, _const(mean, x))).view(self.shape))


def uniform_(mode, self, a=0.0, b=1.0, *, generator=None):
    """An initialization draw: u = uniform(seed, 1, the draw's ordinal, INIT) row-major in [0, 1);
    self = u * f32(b - a) (b - a in float64), then + f32(a) unless a is 0."""
    _check_f32(self)
    u = repops.uniform(mode.seed, INIT_C1, mode.init_draw(), repops.PURPOSE_INIT, self.numel())
    x = ops.scale(u, f32(float(b) - float(a)))
    return self.copy_((x if a == 0 else _add(x, _const(a, x))).view(self.shape))


# ------------------------------------------------------------------ the table
def _inplace(fn):
    """The in-place form of a mapped operator: computed out of place, then written into self."""
    def mapped(self, *args, **kwargs):
        out = fn(self, *args, **kwargs)
        if out is PASS:
            return PASS
        if out.shape != self.shape:
            raise Unmapped("broadcasting into its own operand")
        return self.copy_(out)
    return mapped


def _modeless(fn):
    """A mapping that needs nothing from the mode."""
    def mapped(mode, *args, **kwargs):
        return fn(*args, **kwargs)
    mapped.__doc__ = fn.__doc__
    return mapped


# aten name -> repops kernel of the canonical functions (contract §5)
UNARY_KERNELS = {"reciprocal": "recip", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
                 "sin": "sin", "cos": "cos", "tanh": "tanh", "erf": "erf", "sigmoid": "sigmoid"}
ELEMENTWISE = {
    "add.Tensor": add, "add.Scalar": add, "sub.Tensor": sub, "sub.Scalar": sub, "mul.Tensor": mul,
    "mul.Scalar": mul, "div.Tensor": div, "div.Scalar": div, "div.Tensor_mode": div, "neg": neg,
    "relu": relu, "abs": absolute, "sign": sign, "pow.Tensor_Scalar": power, "gelu": gelu,
    "silu": _unary(silu),
    **{name: _unary(_kernel(kernel)) for name, kernel in UNARY_KERNELS.items()},
}
IN_PLACE = {"add_.Tensor": "add.Tensor", "add_.Scalar": "add.Scalar", "sub_.Tensor": "sub.Tensor",
            "sub_.Scalar": "sub.Scalar", "mul_.Tensor": "mul.Tensor", "mul_.Scalar": "mul.Scalar",
            "div_.Tensor": "div.Tensor", "div_.Scalar": "div.Scalar", "div_.Tensor_mode": "div.Tensor_mode",
            "pow_.Scalar": "pow.Tensor_Scalar",
            **{name + "_": name for name in ("neg", "relu", "abs", "sign", "gelu", "sigmoid", "silu", *UNARY_KERNELS)}}

MAPPED = {"aten::" + name: _modeless(fn) for name, fn in {
    **ELEMENTWISE, **{name: _inplace(ELEMENTWISE[of]) for name, of in IN_PLACE.items()},
    "rsub.Tensor": rsub, "rsub.Scalar": rsub, "sgn": sign,
    "tanh_backward": tanh_backward, "sigmoid_backward": sigmoid_backward, "silu_backward": silu_backward,
    "gelu_backward": gelu_backward, "threshold_backward": threshold_backward,
    "sum.dim_IntList": reduce_sum, "sum": reduce_sum, "mean.dim": reduce_mean, "mean": reduce_mean,
    "amax": reduce_amax, "max": reduce_max, "max.dim": reduce_max,
    "_softmax": softmax, "_log_softmax": log_softmax, "_softmax_backward_data": softmax_backward,
    "_log_softmax_backward_data": log_softmax_backward,
    "nll_loss_forward": nll_loss_forward, "nll_loss_backward": nll_loss_backward,
    "native_layer_norm": native_layer_norm, "native_layer_norm_backward": native_layer_norm_backward,
    "embedding_dense_backward": embedding_dense_backward, "native_dropout_backward": native_dropout_backward,
    **{f"{op}.{form}": _comparison(getattr(torch, op)) for op in ("eq", "ne", "lt", "le", "gt", "ge")
       for form in ("Tensor", "Scalar")},
}.items()} | {"aten::mm": mm, "aten::bmm": mm, "aten::mv": mv, "aten::dot": dot, "aten::addmm": addmm,
              "aten::baddbmm": addmm, "aten::native_dropout": native_dropout, "aten::bernoulli_.float": bernoulli_}
# Only while a model is constructed (guard.Guard.construction): its initialization draws.
INIT = {"aten::normal_": normal_, "aten::uniform_": uniform_}
