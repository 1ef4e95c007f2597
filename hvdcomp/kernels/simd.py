"""Eight-lane building blocks of the fused kernels, as numba intrinsics (LLVM vector code).

Each works on 8 consecutive elements ``[i, i + 8)`` of C-contiguous 1-D float32/float64 arrays
(one ``<8 x float>`` / ``<8 x double>`` vector) and does per lane exactly the IEEE operation the
scalar code (and NumPy) does, so results are bit-identical to the element-by-element reference.
Lane ``k`` is element ``i + k``; in a packed byte it is bit ``7 - k`` (``hvdcomp.backend.bits``).
The caller guarantees ``i + 8 <= len``.
"""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

LANES = 8


def _vector(context, builder, aty, value, index):
    """A ``<8 x dtype>*`` pointing at element ``index`` of array ``value`` (type ``aty``)."""
    ary = context.make_array(aty)(context, builder, value)
    ptr = builder.gep(ary.data, [index])
    return builder.bitcast(ptr, ir.VectorType(context.get_value_type(aty.dtype), LANES).as_pointer())


def _int_vector(vec):
    """The integer vector type of the same width as float vector ``vec``."""
    width = 32 if isinstance(vec.type.element, ir.FloatType) else 64
    return ir.VectorType(ir.IntType(width), LANES), width


def _packed(builder, ints):
    """The packed byte of 8 lanes (bit ``7 - k`` set when lane k's sign bit is clear)."""
    neg = builder.icmp_signed("<", ints, ir.Constant(ints.type, [0] * LANES))
    byte = builder.xor(builder.bitcast(neg, ir.IntType(8)), ir.Constant(ir.IntType(8), 0xFF))
    return builder.call(builder.module.declare_intrinsic("llvm.bitreverse", [ir.IntType(8)]),
                        [byte])


def _sum_stored(context, builder, sig, args, index):
    """The vector ``g + e`` (``g`` alone when ``e`` is None) at element ``index`` of the first
    three arguments ``(g, e, out)``, also stored to ``out`` unless it is None."""
    gt, et, ot = sig.args[:3]
    v = builder.load(_vector(context, builder, gt, args[0], index), align=1)
    if not isinstance(et, types.NoneType):
        v = builder.fadd(v, builder.load(_vector(context, builder, et, args[1], index), align=1))
    if not isinstance(ot, types.NoneType):
        builder.store(v, _vector(context, builder, ot, args[2], index), align=1)
    return v


def _magnitude(builder, v):
    """``(ints, |v|)``: the float vector's bits as integers, and its magnitude (sign bit
    cleared)."""
    ivt, width = _int_vector(v)
    ints = builder.bitcast(v, ivt)
    mask = ir.Constant(ivt, [(1 << width - 1) - 1] * LANES)
    return ints, builder.bitcast(builder.and_(ints, mask), v.type)


@intrinsic
def compensate8(typingctx, g, e, p, acc, i):
    """``v = g[i:i+8] + e[i:i+8]`` (``g`` alone when ``e`` is None), stored to ``p[i:i+8]``
    (unless ``p`` is None); ``acc[0:8] += |v|`` (``acc``: 8 elements of the same dtype); returns
    the packed sign byte of ``v`` (uint8)."""
    def codegen(context, builder, sig, args):
        v = _sum_stored(context, builder, sig, args, args[4])
        ints, mag = _magnitude(builder, v)
        ap = _vector(context, builder, sig.args[3], args[3], context.get_constant(types.intp, 0))
        builder.store(builder.fadd(builder.load(ap, align=1), mag), ap, align=1)
        return _packed(builder, ints)
    return types.uint8(g, e, p, acc, i), codegen


@intrinsic
def sum_above8(typingctx, g, e, out, i, threshold):
    """``v = g[i:i+8] + e[i:i+8]`` (``g`` alone when ``e`` is None), stored to ``out[i:i+8]``
    (unless ``out`` is None); returns the uint8 mask of the lanes with ``|v| >= threshold``
    (bit k for lane k; ``threshold`` a scalar of the arrays' dtype)."""
    def codegen(context, builder, sig, args):
        mag = _magnitude(builder, _sum_stored(context, builder, sig, args, args[3]))[1]
        hit = builder.fcmp_ordered(">=", mag, _splat(builder, args[4], mag.type))
        return builder.bitcast(hit, ir.IntType(8))
    return types.uint8(g, e, out, i, threshold), codegen


def _splat(builder, x, vtype):
    """The vector ``vtype`` with every lane ``x``."""
    one = builder.insert_element(ir.Constant(vtype, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), LANES),
                                                        [0] * LANES))


def _decoder(local):
    """The codegen of ``decode8`` (``local``: with the own-message term)."""
    def codegen(context, builder, sig, args):
        pt, st, mt = sig.args[1:4]
        vp = builder.load(_vector(context, builder, pt, args[1], args[4]), align=1)
        ivt, width = _int_vector(vp)
        lane_bits = ir.Constant(ir.VectorType(ir.IntType(8), LANES), [128 >> k for k in range(LANES)])
        up = builder.icmp_unsigned("!=", builder.and_(_splat(builder, args[0], lane_bits.type),
                                                      lane_bits),
                                   ir.Constant(lane_bits.type, [0] * LANES))

        def signed(x):  # the vector b * x: +x where the bit is 1, -x elsewhere (exact)
            vec = _splat(builder, x, vp.type)
            return builder.select(up, vec, builder.fneg(vec))
        builder.store(signed(args[5]), _vector(context, builder, st, args[2], args[4]), align=1)
        mem = builder.fsub(vp, signed(args[6]))
        if local:  # copysign(c2, p): p's sign bit over c2's bits (c2 >= 0)
            sign = builder.and_(builder.bitcast(vp, ivt), ir.Constant(ivt, [1 << width - 1] * LANES))
            c2 = builder.bitcast(_splat(builder, args[7], vp.type), ivt)
            mem = builder.fsub(mem, builder.bitcast(builder.or_(sign, c2), vp.type))
        builder.store(mem, _vector(context, builder, mt, args[3], args[4]), align=1)
        return context.get_dummy_value()
    return codegen


@intrinsic
def decode8(typingctx, byte, p, step, memory, i, d, c1):
    """For the 8 lanes of ``byte`` (b = +1 where the bit is 1, else -1): ``step[i:i+8] = b * d``
    and ``memory[i:i+8] = p - b * c1``, with ``b * x`` the exact sign flip; ``memory`` may be
    ``p``. ``d``, ``c1``: scalars of the arrays' dtype."""
    return types.none(byte, p, step, memory, i, d, c1), _decoder(False)


@intrinsic
def decode8_local(typingctx, byte, p, step, memory, i, d, c1, c2):
    """``decode8``, then ``memory[i:i+8] -= copysign(c2, p)`` (``c2 >= 0``, same dtype)."""
    return types.none(byte, p, step, memory, i, d, c1, c2), _decoder(True)
