//! Atomic operations on target memory: fi_atomic(3)'s datatypes and operations, which
//! (operation, datatype) pairs each of the three atomic function families accepts, and the engine
//! that executes one request on target memory element by element. It does no I/O: a provider
//! finds the target region, then calls [`apply`] — no provider writes the arithmetic again.
//!
//! # Atomicity is the caller's
//! [`apply`] reads and writes plain memory. fi_atomic(3) promises atomicity per element and only
//! against a single actor (one domain) at a time; a provider meets that by executing every atomic
//! aimed at a target region serially — one progress thread, or a lock held around each
//! [`apply`] — and by not letting its own RMA writes run concurrently with them.
//!
//! # Values
//! Elements are in host byte order and may sit at any address (all access is unaligned).
//! Arithmetic follows the C expressions in fi_atomic(3): integers wrap on overflow, floats use
//! IEEE 754 comparison (`NaN` compares false, `-0.0 == 0.0`), so `FI_MIN` with a `NaN` operand
//! leaves the target alone. Complex products use the textbook formula `(ac-bd) + (ad+bc)i`
//! without C Annex G's infinity/NaN recovery.

use std::ops::{BitAnd, BitOr, BitXor, Not};

use crate::error::{Error, Result};

use crate::consts::c_enum;

c_enum! {
    /// `enum fi_datatype`: the type of each element of an atomic request.
    Datatype: i32 {
        /// `int8_t`.
        Int8 = 0 => "FI_INT8",
        /// `uint8_t`.
        UInt8 = 1 => "FI_UINT8",
        /// `int16_t`.
        Int16 = 2 => "FI_INT16",
        /// `uint16_t`.
        UInt16 = 3 => "FI_UINT16",
        /// `int32_t`.
        Int32 = 4 => "FI_INT32",
        /// `uint32_t`.
        UInt32 = 5 => "FI_UINT32",
        /// `int64_t`.
        Int64 = 6 => "FI_INT64",
        /// `uint64_t`.
        UInt64 = 7 => "FI_UINT64",
        /// IEEE 754 binary32.
        Float = 8 => "FI_FLOAT",
        /// IEEE 754 binary64.
        Double = 9 => "FI_DOUBLE",
        /// Two binary32: real part, then imaginary part.
        FloatComplex = 10 => "FI_FLOAT_COMPLEX",
        /// Two binary64: real part, then imaginary part.
        DoubleComplex = 11 => "FI_DOUBLE_COMPLEX",
        /// C `long double`: x87 80-bit extended in a 16-byte slot on x86-64. Never valid here.
        LongDouble = 12 => "FI_LONG_DOUBLE",
        /// Two `long double`s. Never valid here.
        LongDoubleComplex = 13 => "FI_LONG_DOUBLE_COMPLEX",
        /// `__int128`.
        Int128 = 14 => "FI_INT128",
        /// `unsigned __int128`.
        UInt128 = 15 => "FI_UINT128",
    }
}

c_enum! {
    /// `enum fi_op`: what an atomic does to each target element.
    AtomicOp: i32 {
        /// `if (buf < addr) addr = buf`.
        Min = 0 => "FI_MIN",
        /// `if (buf > addr) addr = buf`.
        Max = 1 => "FI_MAX",
        /// `addr = addr + buf`.
        Sum = 2 => "FI_SUM",
        /// `addr = addr * buf`.
        Prod = 3 => "FI_PROD",
        /// `addr = addr || buf`.
        Lor = 4 => "FI_LOR",
        /// `addr = addr && buf`.
        Land = 5 => "FI_LAND",
        /// `addr = addr | buf`.
        Bor = 6 => "FI_BOR",
        /// `addr = addr & buf`.
        Band = 7 => "FI_BAND",
        /// `addr = (addr && !buf) || (!addr && buf)`.
        Lxor = 8 => "FI_LXOR",
        /// `addr = addr ^ buf`.
        Bxor = 9 => "FI_BXOR",
        /// `result = addr`; fetch only, the operand is ignored.
        Read = 10 => "FI_ATOMIC_READ",
        /// `addr = buf`.
        Write = 11 => "FI_ATOMIC_WRITE",
        /// `if (compare == addr) addr = buf`.
        Cswap = 12 => "FI_CSWAP",
        /// `if (compare != addr) addr = buf`.
        CswapNe = 13 => "FI_CSWAP_NE",
        /// `if (compare <= addr) addr = buf`: the compare value is the left operand.
        CswapLe = 14 => "FI_CSWAP_LE",
        /// `if (compare < addr) addr = buf`.
        CswapLt = 15 => "FI_CSWAP_LT",
        /// `if (compare >= addr) addr = buf`.
        CswapGe = 16 => "FI_CSWAP_GE",
        /// `if (compare > addr) addr = buf`.
        CswapGt = 17 => "FI_CSWAP_GT",
        /// `addr = (buf & compare) | (addr & ~compare)`.
        Mswap = 18 => "FI_MSWAP",
    }
}

/// What a datatype can take part in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Integer,
    Real,
    Complex,
    /// `long double` and its complex: no exact Rust type, so unsupported.
    Extended,
}

impl Datatype {
    /// Bytes per element in memory (`fi_atomic_attr.size`). `long double` is reported as the
    /// 16-byte slot x86-64 gives it, its complex as 32, even though no operation accepts them.
    pub fn size(self) -> usize {
        match self {
            Datatype::Int8 | Datatype::UInt8 => 1,
            Datatype::Int16 | Datatype::UInt16 => 2,
            Datatype::Int32 | Datatype::UInt32 | Datatype::Float => 4,
            Datatype::Int64 | Datatype::UInt64 | Datatype::Double | Datatype::FloatComplex => 8,
            Datatype::DoubleComplex
            | Datatype::LongDouble
            | Datatype::Int128
            | Datatype::UInt128 => 16,
            Datatype::LongDoubleComplex => 32,
        }
    }

    /// True for the signed and unsigned integers, 128-bit included.
    pub fn is_integer(self) -> bool {
        self.class() == Class::Integer
    }

    fn class(self) -> Class {
        match self {
            Datatype::Float | Datatype::Double => Class::Real,
            Datatype::FloatComplex | Datatype::DoubleComplex => Class::Complex,
            Datatype::LongDouble | Datatype::LongDoubleComplex => Class::Extended,
            _ => Class::Integer,
        }
    }
}

impl AtomicOp {
    /// True for the compare-atomic operations, `FI_CSWAP` through `FI_MSWAP`.
    pub fn is_compare(self) -> bool {
        self >= AtomicOp::Cswap
    }
}

/// Whether `op` means anything on `dt`, whichever function family carries it.
///
/// Reading of fi_atomic(3), which defines each operation by a C expression and lists no
/// per-type table: an operation is defined where its C expression is.
/// - `<`/`>` do not exist for complex numbers: `FI_MIN`, `FI_MAX` and `FI_CSWAP_LE/LT/GE/GT`
///   are real-only. `==`/`!=` do, so `FI_CSWAP`/`FI_CSWAP_NE` take complex types.
/// - `|`, `&`, `^`, `~` are integer-only: `FI_BOR/BAND/BXOR` and `FI_MSWAP`.
/// - `||`, `&&`, `!` work on every scalar in C (a complex is "true" when either part is
///   non-zero), so `FI_LOR/LAND/LXOR` take every type, as libfabric's own utility providers do;
///   the result is 0 or 1 in the target's type.
/// - `FI_SUM`, `FI_PROD`, read, write: every type.
/// - `FI_INT128`/`FI_UINT128` are integers like the others; `i128`/`u128` carry them exactly.
/// - `FI_LONG_DOUBLE(_COMPLEX)`: the man page leaves their format to the platform and provider.
///   Rust has no x87 80-bit type, rounding through `f64` would be inexact, and a soft-float is
///   not worth it for a type providers commonly refuse, so no operation accepts them.
fn defined(op: AtomicOp, dt: Datatype) -> bool {
    use AtomicOp::*;
    match dt.class() {
        Class::Integer => true,
        Class::Real => !matches!(op, Bor | Band | Bxor | Mswap),
        Class::Complex => !matches!(
            op,
            Min | Max | Bor | Band | Bxor | CswapLe | CswapLt | CswapGe | CswapGt | Mswap
        ),
        Class::Extended => false,
    }
}

/// `fi_atomicvalid`: may `op` on `dt` be issued as a base (non-fetching) atomic? The base
/// operations are `FI_MIN` through `FI_BXOR` and `FI_ATOMIC_WRITE`.
pub fn valid(op: AtomicOp, dt: Datatype) -> bool {
    (op <= AtomicOp::Bxor || op == AtomicOp::Write) && defined(op, dt)
}

/// `fi_fetch_atomicvalid`: may `op` on `dt` be issued as a fetch atomic? The fetch operations
/// are `FI_MIN` through `FI_ATOMIC_WRITE`, so `FI_ATOMIC_READ` is fetch-only.
pub fn fetch_valid(op: AtomicOp, dt: Datatype) -> bool {
    op <= AtomicOp::Write && defined(op, dt)
}

/// `fi_compare_atomicvalid`: may `op` on `dt` be issued as a compare atomic (`FI_CSWAP`
/// through `FI_MSWAP`)?
pub fn compare_valid(op: AtomicOp, dt: Datatype) -> bool {
    op.is_compare() && defined(op, dt)
}

/// How many `dt` elements fit in `bytes`: the `count` an atomic-valid call reports for a
/// provider whose largest atomic payload is `bytes`.
pub fn count_limit(dt: Datatype, bytes: usize) -> usize {
    bytes / dt.size()
}

/// A C `float complex` / `double complex`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
struct Complex<F> {
    re: F,
    im: F,
}

/// What every accepted datatype supports: the operations defined on all of them.
trait Elem: Copy + PartialEq {
    fn nonzero(self) -> bool;
    fn from_bool(b: bool) -> Self;
    fn plus(self, o: Self) -> Self;
    fn times(self, o: Self) -> Self;
}

/// Ordered (non-complex) types add `FI_MIN`, `FI_MAX` and the ordering compare-swaps.
trait Real: Elem + PartialOrd {}

/// Integers add the bitwise operations.
trait Int:
    Real + BitAnd<Output = Self> + BitOr<Output = Self> + BitXor<Output = Self> + Not<Output = Self>
{
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn nonzero(self) -> bool { self != 0 }
            fn from_bool(b: bool) -> Self { <$t>::from(b) }
            fn plus(self, o: Self) -> Self { self.wrapping_add(o) }
            fn times(self, o: Self) -> Self { self.wrapping_mul(o) }
        }
        impl Real for $t {}
        impl Int for $t {}
    )*};
}
int_elem!(i8, u8, i16, u16, i32, u32, i64, u64, i128, u128);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn nonzero(self) -> bool { self != 0.0 }
            fn from_bool(b: bool) -> Self { if b { 1.0 } else { 0.0 } }
            fn plus(self, o: Self) -> Self { self + o }
            fn times(self, o: Self) -> Self { self * o }
        }
        impl Real for $t {}
        impl Elem for Complex<$t> {
            fn nonzero(self) -> bool { self.re != 0.0 || self.im != 0.0 }
            fn from_bool(b: bool) -> Self { Complex { re: <$t>::from_bool(b), im: 0.0 } }
            fn plus(self, o: Self) -> Self { Complex { re: self.re + o.re, im: self.im + o.im } }
            fn times(self, o: Self) -> Self {
                Complex {
                    re: self.re * o.re - self.im * o.im,
                    im: self.re * o.im + self.im * o.re,
                }
            }
        }
    )*};
}
float_elem!(f32, f64);

// The Rust types must have exactly the sizes the wire and `size()` promise.
const _: () = {
    assert!(std::mem::size_of::<Complex<f32>>() == 8);
    assert!(std::mem::size_of::<Complex<f64>>() == 16);
    assert!(std::mem::size_of::<i128>() == 16);
};

/// The buffers of one request. `operand`/`compare` are null where the operation ignores them.
#[derive(Clone, Copy)]
struct Buffers {
    target: *mut u8,
    operand: *const u8,
    compare: *const u8,
    result: *mut u8,
    count: usize,
}

/// Runs `f(target, operand, compare)` on each element, storing what it returns into the target
/// and the original target into `result`. A null operand or compare reads as the target value.
///
/// # Safety
/// As [`apply`], with `T` the element type of the request.
unsafe fn each<T: Copy>(b: Buffers, f: impl Fn(T, T, T) -> Option<T>) {
    let (t, s, c, r) = (
        b.target.cast::<T>(),
        b.operand.cast::<T>(),
        b.compare.cast::<T>(),
        b.result.cast::<T>(),
    );
    for i in 0..b.count {
        // SAFETY: `apply`'s contract: every non-null buffer holds `count` elements of `T`, at
        // any alignment (hence the unaligned accesses), and `target`/`result` overlap nothing.
        unsafe {
            let old = t.add(i).read_unaligned();
            let src = if s.is_null() {
                old
            } else {
                s.add(i).read_unaligned()
            };
            let cmp = if c.is_null() {
                old
            } else {
                c.add(i).read_unaligned()
            };
            if let Some(new) = f(old, src, cmp) {
                t.add(i).write_unaligned(new);
            }
            if !r.is_null() {
                r.add(i).write_unaligned(old);
            }
        }
    }
}

/// The integer-only operations, then [`real_op`]'s. False if `op` is none of them.
///
/// # Safety
/// As [`each`].
unsafe fn int_op<T: Int>(op: AtomicOp, b: Buffers) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        match op {
            AtomicOp::Bor => each(b, |t: T, s, _| Some(t | s)),
            AtomicOp::Band => each(b, |t: T, s, _| Some(t & s)),
            AtomicOp::Bxor => each(b, |t: T, s, _| Some(t ^ s)),
            AtomicOp::Mswap => each(b, |t: T, s, c| Some((s & c) | (t & !c))),
            _ => return real_op::<T>(op, b),
        }
    }
    true
}

/// The ordering operations, then [`common_op`]'s.
///
/// # Safety
/// As [`each`].
unsafe fn real_op<T: Real>(op: AtomicOp, b: Buffers) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        match op {
            AtomicOp::Min => each(b, |t: T, s, _| (s < t).then_some(s)),
            AtomicOp::Max => each(b, |t: T, s, _| (s > t).then_some(s)),
            AtomicOp::CswapLe => each(b, |t: T, s, c| (c <= t).then_some(s)),
            AtomicOp::CswapLt => each(b, |t: T, s, c| (c < t).then_some(s)),
            AtomicOp::CswapGe => each(b, |t: T, s, c| (c >= t).then_some(s)),
            AtomicOp::CswapGt => each(b, |t: T, s, c| (c > t).then_some(s)),
            _ => return common_op::<T>(op, b),
        }
    }
    true
}

/// The operations every accepted datatype supports.
///
/// # Safety
/// As [`each`].
unsafe fn common_op<T: Elem>(op: AtomicOp, b: Buffers) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        match op {
            AtomicOp::Sum => each(b, |t: T, s, _| Some(t.plus(s))),
            AtomicOp::Prod => each(b, |t: T, s, _| Some(t.times(s))),
            AtomicOp::Lor => each(b, |t: T, s, _| {
                Some(T::from_bool(t.nonzero() || s.nonzero()))
            }),
            AtomicOp::Land => each(b, |t: T, s, _| {
                Some(T::from_bool(t.nonzero() && s.nonzero()))
            }),
            AtomicOp::Lxor => each(b, |t: T, s, _| {
                Some(T::from_bool(t.nonzero() != s.nonzero()))
            }),
            AtomicOp::Read => each(b, |_: T, _, _| None),
            AtomicOp::Write => each(b, |_: T, s, _| Some(s)),
            AtomicOp::Cswap => each(b, |t: T, s, c| (c == t).then_some(s)),
            AtomicOp::CswapNe => each(b, |t: T, s, c| (c != t).then_some(s)),
            _ => return false,
        }
    }
    true
}

/// Executes atomic `op` on `count` elements of `dt` at `target`, as fi_atomic(3) defines it,
/// storing each element's original value into `result` when `result` is not null.
///
/// Accepts every pair that [`fetch_valid`] or [`compare_valid`] accepts (a superset of
/// [`valid`]); any other pair is `Error::OpNotSupp` with nothing touched. `operand` is ignored
/// for `FI_ATOMIC_READ`, `compare` for everything but the compare operations. A null pointer the
/// operation needs (target, operand, compare, or result for `FI_ATOMIC_READ`) is `Error::Inval`.
/// `count == 0` touches nothing.
///
/// Not atomic by itself: see the module documentation.
///
/// # Safety
/// For `n = count * dt.size()` bytes: `target` must be valid for reads and writes of `n` bytes;
/// `operand` (unless ignored) and `compare` (unless ignored) valid for reads of `n` bytes;
/// `result`, if not null, valid for writes of `n` bytes. No alignment is required. `target` and
/// `result` must not overlap each other or the operand and compare buffers, and nothing else may
/// access these bytes during the call.
pub unsafe fn apply(
    op: AtomicOp,
    dt: Datatype,
    target: *mut u8,
    operand: *const u8,
    compare: *const u8,
    result: *mut u8,
    count: usize,
) -> Result<()> {
    let err = |why: &str| format!("atomic {} on {}: {why}", op.c_name(), dt.c_name());
    if !(fetch_valid(op, dt) || compare_valid(op, dt)) {
        return Err(Error::OpNotSupp(err("not a defined combination")));
    }
    if count == 0 {
        return Ok(());
    }
    if count.checked_mul(dt.size()).is_none() {
        return Err(Error::Inval(err("element count overflows")));
    }
    let (read, cmp) = (op == AtomicOp::Read, op.is_compare());
    let operand = if read { std::ptr::null() } else { operand };
    let compare = if cmp { compare } else { std::ptr::null() };
    let missing = [
        ("target", target.is_null()),
        ("operand", !read && operand.is_null()),
        ("compare", cmp && compare.is_null()),
        ("result", read && result.is_null()),
    ];
    if let Some((buf, _)) = missing.iter().find(|m| m.1) {
        return Err(Error::Inval(err(&format!("{buf} buffer is null"))));
    }
    let b = Buffers {
        target,
        operand,
        compare,
        result,
        count,
    };
    // SAFETY: the caller's contract covers each buffer for `count` elements of `dt`, and the
    // match pairs every datatype with the Rust type of exactly its size and representation.
    let done = unsafe {
        match dt {
            Datatype::Int8 => int_op::<i8>(op, b),
            Datatype::UInt8 => int_op::<u8>(op, b),
            Datatype::Int16 => int_op::<i16>(op, b),
            Datatype::UInt16 => int_op::<u16>(op, b),
            Datatype::Int32 => int_op::<i32>(op, b),
            Datatype::UInt32 => int_op::<u32>(op, b),
            Datatype::Int64 => int_op::<i64>(op, b),
            Datatype::UInt64 => int_op::<u64>(op, b),
            Datatype::Int128 => int_op::<i128>(op, b),
            Datatype::UInt128 => int_op::<u128>(op, b),
            Datatype::Float => real_op::<f32>(op, b),
            Datatype::Double => real_op::<f64>(op, b),
            Datatype::FloatComplex => common_op::<Complex<f32>>(op, b),
            Datatype::DoubleComplex => common_op::<Complex<f64>>(op, b),
            Datatype::LongDouble | Datatype::LongDoubleComplex => false,
        }
    };
    if done {
        Ok(())
    } else {
        Err(Error::OpNotSupp(err("no implementation")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AtomicOp as Op;
    use Datatype as Dt;

    /// A value in the test's own model, independent of the engine's types: integers as `i128`
    /// bit patterns normalized to the datatype's width and signedness, floats as `f64`.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum V {
        I(i128),
        F(f64),
        C(f64, f64),
    }
    use V::{C, F, I};

    /// (bits, signed) of an integer datatype.
    fn shape(dt: Dt) -> (u32, bool) {
        (dt.size() as u32 * 8, dt.c_name().starts_with("FI_INT"))
    }

    /// Truncates `x` to the datatype's width, then sign- or zero-extends it.
    fn norm(dt: Dt, x: i128) -> i128 {
        let (bits, signed) = shape(dt);
        let shift = 128 - bits;
        if signed {
            (x << shift) >> shift
        } else {
            ((x as u128) << shift >> shift) as i128
        }
    }

    /// Rounds an exact-in-f64 value to the datatype's precision.
    fn round(dt: Dt, x: f64) -> f64 {
        match dt {
            Dt::Float | Dt::FloatComplex => x as f32 as f64,
            _ => x,
        }
    }

    fn encode(dt: Dt, v: V, out: &mut Vec<u8>) {
        let mut float = |x: f64| match dt {
            Dt::Float | Dt::FloatComplex => out.extend_from_slice(&(x as f32).to_ne_bytes()),
            _ => out.extend_from_slice(&x.to_ne_bytes()),
        };
        match v {
            F(x) => float(x),
            C(re, im) => {
                float(re);
                float(im);
            }
            I(x) => {
                let mut b = x.to_le_bytes()[..dt.size()].to_vec();
                if cfg!(target_endian = "big") {
                    b.reverse();
                }
                out.extend_from_slice(&b);
            }
        }
    }

    fn lt(dt: Dt, a: V, b: V) -> bool {
        match (a, b) {
            (I(a), I(b)) if shape(dt).1 => a < b,
            (I(a), I(b)) => (a as u128) < (b as u128),
            (F(a), F(b)) => a < b,
            _ => unreachable!("no order on {a:?}, {b:?}"),
        }
    }

    fn nz(v: V) -> bool {
        v != I(0) && v != F(0.0) && v != C(0.0, 0.0)
    }

    fn truth(dt: Dt, b: bool) -> V {
        let x = if b { 1.0 } else { 0.0 };
        match dt.class() {
            Class::Integer => I(b as i128),
            Class::Real => F(x),
            _ => C(x, 0.0),
        }
    }

    fn int(dt: Dt, a: V, b: V, f: fn(i128, i128) -> i128) -> V {
        match (a, b) {
            (I(a), I(b)) => I(norm(dt, f(a, b))),
            _ => unreachable!(),
        }
    }

    /// The new target value fi_atomic(3)'s pseudo-code gives, or `None` for "unchanged".
    fn model(op: Op, dt: Dt, t: V, s: V, c: V) -> Option<V> {
        let r = |x| round(dt, x);
        match (op, t, s) {
            (Op::Min, ..) => lt(dt, s, t).then_some(s),
            (Op::Max, ..) => lt(dt, t, s).then_some(s),
            (Op::Sum, F(a), F(b)) => Some(F(r(a + b))),
            (Op::Sum, C(a, b), C(x, y)) => Some(C(r(a + x), r(b + y))),
            (Op::Sum, ..) => Some(int(dt, t, s, i128::wrapping_add)),
            (Op::Prod, F(a), F(b)) => Some(F(r(a * b))),
            (Op::Prod, C(a, b), C(x, y)) => Some(C(r(a * x - b * y), r(a * y + b * x))),
            (Op::Prod, ..) => Some(int(dt, t, s, i128::wrapping_mul)),
            (Op::Lor, ..) => Some(truth(dt, nz(t) || nz(s))),
            (Op::Land, ..) => Some(truth(dt, nz(t) && nz(s))),
            (Op::Lxor, ..) => Some(truth(dt, nz(t) ^ nz(s))),
            (Op::Bor, ..) => Some(int(dt, t, s, |a, b| a | b)),
            (Op::Band, ..) => Some(int(dt, t, s, |a, b| a & b)),
            (Op::Bxor, ..) => Some(int(dt, t, s, |a, b| a ^ b)),
            (Op::Read, ..) => None,
            (Op::Write, ..) => Some(s),
            (Op::Cswap, ..) => (c == t).then_some(s),
            (Op::CswapNe, ..) => (c != t).then_some(s),
            (Op::CswapLe, ..) => (lt(dt, c, t) || c == t).then_some(s),
            (Op::CswapLt, ..) => lt(dt, c, t).then_some(s),
            (Op::CswapGe, ..) => (lt(dt, t, c) || c == t).then_some(s),
            (Op::CswapGt, ..) => lt(dt, t, c).then_some(s),
            (Op::Mswap, I(t), I(s)) => match c {
                I(c) => Some(I(norm(dt, (s & c) | (t & !c)))),
                _ => unreachable!(),
            },
            (Op::Mswap, ..) => unreachable!(),
        }
    }

    /// (target, operand, compare) per element: equal, smaller, larger, zero and extreme values.
    fn samples(dt: Dt) -> Vec<(V, V, V)> {
        let (bits, signed) = shape(dt);
        let (max, min) = match signed {
            true => (i128::MAX >> (128 - bits), i128::MIN >> (128 - bits)),
            false => (norm(dt, -1), 0),
        };
        let ints = [(5, 2, 5), (-3, -3, 4), (0, 9, 0), (7, 0, -1), (max, 1, max)];
        let ints = ints
            .into_iter()
            .chain([(min, -1, 3), (0x5a, 0x0f, 0x33), (0, 0, 6)]);
        let reals = [
            (1.5, 0.25, 1.5),
            (-2.0, -2.0, -1.0),
            (0.0, 4.0, 0.0),
            (3.25, 0.0, 5.0),
        ];
        // (0.0, -0.0): equal under IEEE, so MIN/MAX keep the target's sign and CSWAP swaps.
        let more = [
            (-0.5, 8.0, -0.5),
            (100.0, -1.0, 50.0),
            (0.0, 0.0, 2.0),
            (0.0, -0.0, -0.0),
        ];
        let reals = reals.into_iter().chain(more);
        let complex = [
            ((1.5, 0.0), (0.25, 1.0), (1.5, 0.0)),
            ((-2.0, 1.0), (-2.0, 1.0), (-2.0, 0.5)),
            ((0.0, 0.0), (4.0, 0.0), (0.0, 0.0)),
            ((0.0, 3.0), (0.0, 0.0), (1.0, 3.0)),
            ((2.0, -1.0), (3.0, 2.0), (2.0, -1.0)),
            ((0.0, 0.0), (0.0, 0.0), (0.5, 0.25)),
        ];
        match dt.class() {
            Class::Integer => ints
                .map(|(t, s, c)| (I(norm(dt, t)), I(norm(dt, s)), I(norm(dt, c))))
                .collect(),
            Class::Real => reals.map(|(t, s, c)| (F(t), F(s), F(c))).collect(),
            _ => complex
                .into_iter()
                .map(|(t, s, c)| (C(t.0, t.1), C(s.0, s.1), C(c.0, c.1)))
                .collect(),
        }
    }

    const GUARD: u8 = 0xee;

    /// `offset` guard bytes, the elements, then 8 guard bytes.
    fn buffer(dt: Dt, offset: usize, vals: impl Iterator<Item = V>) -> Vec<u8> {
        let mut out = vec![GUARD; offset];
        vals.for_each(|v| encode(dt, v, &mut out));
        out.extend_from_slice(&[GUARD; 8]);
        out
    }

    /// [`apply`] on byte slices: as many elements as `s` holds, after checking the others fit.
    fn exec(op: Op, dt: Dt, t: &mut [u8], s: &[u8], c: &[u8], r: Option<&mut [u8]>) -> Result<()> {
        let (len, n) = (s.len(), s.len() / dt.size());
        assert!(t.len() >= len && c.len() >= len && r.as_ref().is_none_or(|r| r.len() >= len));
        let r = r.map_or(std::ptr::null_mut(), |r| r.as_mut_ptr());
        // SAFETY: every buffer holds `n` elements; the `&mut` borrows keep target and result
        // apart from everything else.
        unsafe { apply(op, dt, t.as_mut_ptr(), s.as_ptr(), c.as_ptr(), r, n) }
    }

    /// Runs `op` on `dt`'s samples `offset` bytes into each buffer, with and without a result
    /// buffer, and checks target and result byte for byte, guards included, against the model.
    fn check(op: Op, dt: Dt, offset: usize) {
        let data = samples(dt);
        let new = |&(t, s, c): &(V, V, V)| model(op, dt, t, s, c).unwrap_or(t);
        let expect_t = buffer(dt, offset, data.iter().map(new));
        let expect_r = buffer(dt, offset, data.iter().map(|d| d.0));
        let operand = buffer(dt, offset, data.iter().map(|d| d.1));
        let compare = buffer(dt, offset, data.iter().map(|d| d.2));
        let end = offset + data.len() * dt.size();
        let (s, c) = (&operand[offset..end], &compare[offset..end]);
        let what = format!("{op:?} on {dt:?} at offset {offset}");
        let (mut target, mut result) = (expect_r.clone(), vec![GUARD; expect_r.len()]);
        let (t, r) = (&mut target[offset..], &mut result[offset..]);
        exec(op, dt, t, s, c, Some(r)).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(target, expect_t, "{what}: target");
        assert_eq!(result[offset..], expect_r[offset..], "{what}: result");
        // Without a result buffer (FI_ATOMIC_READ needs one).
        let mut target = expect_r.clone();
        match exec(op, dt, &mut target[offset..], s, c, None) {
            Err(Error::Inval(_)) if op == Op::Read => {}
            res => assert_eq!((res, target), (Ok(()), expect_t), "{what}, no result"),
        }
    }

    #[test]
    fn every_accepted_pair_matches_the_model() {
        let mut pairs = 0;
        for &dt in Dt::ALL {
            for &op in Op::ALL
                .iter()
                .filter(|&&op| fetch_valid(op, dt) || compare_valid(op, dt))
            {
                pairs += 1;
                for offset in [0, 1, 3] {
                    check(op, dt, offset);
                }
                // The samples must exercise both outcomes of every conditional operation.
                if matches!(op, Op::Min | Op::Max) || (op.is_compare() && op != Op::Mswap) {
                    let data = samples(dt);
                    let swaps = data
                        .iter()
                        .filter(|&&(t, s, c)| model(op, dt, t, s, c).is_some());
                    let swaps = swaps.count();
                    assert!(swaps > 0 && swaps < data.len(), "{op:?} on {dt:?}");
                }
            }
        }
        assert_eq!(pairs, 10 * 19 + 2 * 15 + 2 * 9);
    }

    /// The tables written out by hand from fi_atomic(3): `b` base and fetch, `f` fetch only,
    /// `c` compare, `.` not valid. Columns in `fi_datatype` order:
    /// i8 u8 i16 u16 i32 u32 i64 u64 flt dbl cflt cdbl ld cld i128 u128.
    const TABLE: [(Op, &str); 19] = [
        (Op::Min, "bbbbbbbbbb....bb"),
        (Op::Max, "bbbbbbbbbb....bb"),
        (Op::Sum, "bbbbbbbbbbbb..bb"),
        (Op::Prod, "bbbbbbbbbbbb..bb"),
        (Op::Lor, "bbbbbbbbbbbb..bb"),
        (Op::Land, "bbbbbbbbbbbb..bb"),
        (Op::Bor, "bbbbbbbb......bb"),
        (Op::Band, "bbbbbbbb......bb"),
        (Op::Lxor, "bbbbbbbbbbbb..bb"),
        (Op::Bxor, "bbbbbbbb......bb"),
        (Op::Read, "ffffffffffff..ff"),
        (Op::Write, "bbbbbbbbbbbb..bb"),
        (Op::Cswap, "cccccccccccc..cc"),
        (Op::CswapNe, "cccccccccccc..cc"),
        (Op::CswapLe, "cccccccccc....cc"),
        (Op::CswapLt, "cccccccccc....cc"),
        (Op::CswapGe, "cccccccccc....cc"),
        (Op::CswapGt, "cccccccccc....cc"),
        (Op::Mswap, "cccccccc......cc"),
    ];

    #[test]
    fn validity_tables_match_the_man_page() {
        for (op, row) in TABLE {
            for (&dt, cell) in Dt::ALL.iter().zip(row.chars()) {
                let got = (valid(op, dt), fetch_valid(op, dt), compare_valid(op, dt));
                let want = (cell == 'b', cell == 'b' || cell == 'f', cell == 'c');
                assert_eq!(got, want, "{} on {}", op.c_name(), dt.c_name());
            }
        }
    }

    #[test]
    fn rejected_pairs_are_op_not_supp_and_touch_nothing() {
        let mut rejected = 0;
        for &dt in Dt::ALL {
            for &op in Op::ALL
                .iter()
                .filter(|&&op| !fetch_valid(op, dt) && !compare_valid(op, dt))
            {
                rejected += 1;
                let (mut target, mut result) = ([7u8; 64], [3u8; 64]);
                let res = exec(op, dt, &mut target, &[1; 64], &[2; 64], Some(&mut result));
                let e = res.unwrap_err();
                assert!(matches!(e, Error::OpNotSupp(_)), "{op:?} on {dt:?}: {e}");
                assert_eq!(e.errno(), crate::consts::errno::FI_EOPNOTSUPP);
                assert_eq!((target, result), ([7u8; 64], [3u8; 64]));
            }
        }
        assert_eq!(rejected, 16 * 19 - 238);
    }

    /// Runs one request on typed arrays; returns the target afterwards.
    fn run<T: Copy, const N: usize>(op: Op, dt: Dt, t: [T; N], s: [T; N], c: [T; N]) -> [T; N] {
        let mut t = t;
        assert_eq!(std::mem::size_of::<T>(), dt.size());
        let (tp, sp, cp) = (t.as_mut_ptr().cast(), s.as_ptr().cast(), c.as_ptr().cast());
        // SAFETY: the arrays hold `N` elements of the datatype `T` stands for.
        unsafe { apply(op, dt, tp, sp, cp, std::ptr::null_mut(), N) }.unwrap();
        t
    }

    /// `case!(op, datatype, target, operand[, compare] => expected target)`.
    macro_rules! case {
        ($op:ident, $dt:ident, $t:expr, $s:expr => $want:expr) => {
            case!($op, $dt, $t, $s, $s => $want)
        };
        ($op:ident, $dt:ident, $t:expr, $s:expr, $c:expr => $want:expr) => {
            let got = run(Op::$op, Dt::$dt, $t, $s, $c);
            assert_eq!(got, $want, "{:?} on {:?}", Op::$op, Dt::$dt)
        };
    }

    #[test]
    fn hand_computed_cases() {
        case!(Sum, Int8, [127i8, -128], [1, -1] => [-128, 127]);
        case!(Prod, UInt8, [16u8], [17] => [16]);
        // Signedness decides MIN: -1 is the smallest i32 but the largest u32.
        case!(Min, Int32, [5i32], [-1] => [-1]);
        case!(Min, UInt32, [5u32], [u32::MAX] => [5]);
        case!(Max, UInt32, [5u32], [u32::MAX] => [u32::MAX]);
        // FI_CSWAP_LE swaps when compare <= target: the target is the right-hand side.
        case!(CswapLe, UInt64, [10u64; 3], [99; 3], [3, 10, 11] => [99, 99, 10]);
        case!(CswapGt, UInt64, [10u64; 3], [99; 3], [3, 10, 11] => [10, 10, 99]);
        case!(CswapLt, Int16, [-4i16; 3], [1; 3], [-5, -4, -3] => [1, -4, -4]);
        case!(CswapGe, Int16, [-4i16; 3], [1; 3], [-5, -4, -3] => [-4, 1, 1]);
        case!(Mswap, UInt16, [0xaaaau16], [0x1234], [0x00ff] => [0xaa34]);
        case!(Lor, Int32, [0i32, 0], [5, 0] => [1, 0]);
        case!(Lxor, Int32, [3i32, 3], [5, 0] => [0, 1]);
        case!(Land, Double, [-0.0f64, 2.5], [1.0, f64::NAN] => [0.0, 1.0]);
        case!(Sum, UInt128, [u64::MAX as u128, u128::MAX], [1, 1] => [1 << 64, 0]);
        case!(Prod, Int128, [-(1i128 << 100)], [1 << 20] => [-(1i128 << 120)]);
        // (1+2i)(3+4i) = -5+10i
        case!(Prod, FloatComplex, [[1.0f32, 2.0]], [[3.0, 4.0]] => [[-5.0, 10.0]]);
        case!(Lor, DoubleComplex, [[0.0f64, 0.0]], [[0.0, -3.0]] => [[1.0, 0.0]]);
        // NaN compares false: it never replaces a target, nor matches one.
        case!(CswapNe, Float, [f32::NAN], [1.0], [f32::NAN] => [1.0]);
        case!(Min, Double, [2.0f64], [f64::NAN] => [2.0]);
        let t = run(Op::Cswap, Dt::Float, [f32::NAN], [1.0], [f32::NAN]);
        assert!(t[0].is_nan());
    }

    #[test]
    fn read_ignores_operand_and_missing_buffers_are_inval() {
        let (mut target, mut result) = ([1u32, 2, 3], [0u32; 3]);
        let t = target.as_mut_ptr().cast::<u8>();
        let r = result.as_mut_ptr().cast::<u8>();
        let (null, null_mut) = (std::ptr::null::<u8>(), std::ptr::null_mut::<u8>());
        let inval = |res: Result<()>| assert!(matches!(res, Err(Error::Inval(_))), "{res:?}");
        // SAFETY: the arrays hold three u32; null pointers are never dereferenced.
        unsafe {
            apply(Op::Read, Dt::UInt32, t, null, null, r, 3).unwrap();
            inval(apply(Op::Sum, Dt::UInt32, t, null, null, r, 3));
            inval(apply(Op::Cswap, Dt::UInt32, t, r, null, r, 3));
            inval(apply(Op::Write, Dt::UInt32, null_mut, r, null, r, 3));
            inval(apply(Op::Sum, Dt::UInt64, t, r, null, r, usize::MAX));
            // Nothing to do: no buffer is touched, so none is checked.
            apply(Op::Sum, Dt::UInt32, null_mut, null, null, null_mut, 0).unwrap();
        }
        assert_eq!((target, result), ([1, 2, 3], [1, 2, 3]));
    }

    #[test]
    fn names_numbers_and_sizes() {
        for (i, &dt) in Dt::ALL.iter().enumerate() {
            assert_eq!((dt as i32, Dt::from_raw(i as i32)), (i as i32, Some(dt)));
        }
        for (i, &op) in Op::ALL.iter().enumerate() {
            assert_eq!((op as i32, Op::from_raw(i as i32)), (i as i32, Some(op)));
        }
        assert_eq!((Dt::ALL.len(), Op::ALL.len()), (16, 19));
        assert!(Dt::from_raw(16).is_none() && Dt::from_raw(-1).is_none());
        assert!(Op::from_raw(19).is_none());
        assert_eq!(Dt::UInt128.c_name(), "FI_UINT128");
        assert_eq!(Op::Read.c_name(), "FI_ATOMIC_READ");
        let sizes = [1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 8, 16, 16, 32, 16, 16];
        assert_eq!(Dt::ALL.iter().map(|d| d.size()).collect::<Vec<_>>(), sizes);
        assert_eq!(count_limit(Dt::Double, 64), 8);
        assert_eq!(count_limit(Dt::DoubleComplex, 40), 2);
        assert_eq!(count_limit(Dt::UInt128, 15), 0);
        assert!(Dt::Int128.is_integer() && !Dt::Float.is_integer());
    }
}
