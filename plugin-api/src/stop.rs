//! Run-time stops: why a program ended before its final `exit`.
//!
//! A stop is not a compile error. Emitted code records one in the stop fields of
//! [`PjExecEnv`](crate::PjExecEnv) (`stop_kind` = `PJ_STOP_*`, `stop_pc`, `stop_addr`,
//! `stop_access`) and returns; the host decodes that record into a [`Stop`]. The interpreter
//! (`packjit-interp`) reports the same type, so the JIT and the reference are compared
//! stop for stop.

use crate::abi::{PJ_STOP_BUDGET, PJ_STOP_OUT_OF_BOUNDS, PJ_STOP_UNKNOWN_CALLX};
use crate::AccessDirection;
use std::fmt;

/// Why a run stopped without a result: the sandbox contract's run-time stops, each with the
/// eBPF pc (slot index) of the instruction that stopped.
///
/// ```
/// use packjit_plugin_api::{Stop, StopKind};
/// let s = Stop::OutOfBounds { pc: 7, addr: 0x1000, size: 8, write: true };
/// assert_eq!((s.kind(), s.pc()), (StopKind::OutOfBounds, 7));
/// assert!(s.to_string().starts_with("pc 7: out of bounds: 8-byte write at 0x1000"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stop {
    /// A load, store or atomic fell outside every region the program may touch (its context,
    /// its stack block, the host's regions); nothing was read or written by it.
    OutOfBounds {
        /// eBPF pc of the access.
        pc: usize,
        /// First byte of the access.
        addr: u64,
        /// Bytes accessed.
        size: u32,
        /// A store or an atomic (true), a load (false).
        write: bool,
    },
    /// The instruction budget could not pay for the jump or call at `pc`.
    Budget {
        /// eBPF pc of the jump or call.
        pc: usize,
    },
    /// `callx` at `pc` named helper `id`, which is not registered.
    UnknownCallx {
        /// eBPF pc of the `callx`.
        pc: usize,
        /// The register's value (the helper id asked for).
        id: u64,
    },
}

/// The kind of a [`Stop`], without its details (one per `PJ_STOP_*` code but `PJ_STOP_NONE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopKind {
    /// [`Stop::OutOfBounds`] (`PJ_STOP_OUT_OF_BOUNDS`).
    OutOfBounds,
    /// [`Stop::Budget`] (`PJ_STOP_BUDGET`).
    Budget,
    /// [`Stop::UnknownCallx`] (`PJ_STOP_UNKNOWN_CALLX`).
    UnknownCallx,
}

impl StopKind {
    /// The `PJ_STOP_*` code.
    pub const fn code(self) -> u32 {
        match self {
            StopKind::OutOfBounds => PJ_STOP_OUT_OF_BOUNDS,
            StopKind::Budget => PJ_STOP_BUDGET,
            StopKind::UnknownCallx => PJ_STOP_UNKNOWN_CALLX,
        }
    }

    /// Decodes a `PJ_STOP_*` code; `None` for `PJ_STOP_NONE` and unknown codes.
    pub const fn from_code(code: u32) -> Option<StopKind> {
        match code {
            PJ_STOP_OUT_OF_BOUNDS => Some(StopKind::OutOfBounds),
            PJ_STOP_BUDGET => Some(StopKind::Budget),
            PJ_STOP_UNKNOWN_CALLX => Some(StopKind::UnknownCallx),
            _ => None,
        }
    }

    /// A short description ("memory access out of bounds", ...).
    pub const fn describe(self) -> &'static str {
        match self {
            StopKind::OutOfBounds => "memory access out of bounds",
            StopKind::Budget => "instruction budget exhausted",
            StopKind::UnknownCallx => "callx to an unregistered helper id",
        }
    }
}

impl Stop {
    /// The kind of stop.
    pub const fn kind(&self) -> StopKind {
        match self {
            Stop::OutOfBounds { .. } => StopKind::OutOfBounds,
            Stop::Budget { .. } => StopKind::Budget,
            Stop::UnknownCallx { .. } => StopKind::UnknownCallx,
        }
    }

    /// The eBPF pc (slot index) the program stopped at.
    pub const fn pc(&self) -> usize {
        match *self {
            Stop::OutOfBounds { pc, .. } | Stop::Budget { pc } | Stop::UnknownCallx { pc, .. } => {
                pc
            }
        }
    }

    /// For [`Stop::OutOfBounds`]: whether the refused access read or wrote.
    pub const fn direction(&self) -> Option<AccessDirection> {
        match *self {
            Stop::OutOfBounds { write: true, .. } => Some(AccessDirection::Write),
            Stop::OutOfBounds { write: false, .. } => Some(AccessDirection::Read),
            _ => None,
        }
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Stop::OutOfBounds {
                pc,
                addr,
                size,
                write,
            } => write!(
                f,
                "pc {pc}: out of bounds: {size}-byte {} at {addr:#x} is outside the context, \
                 the stack and every registered region",
                if write { "write" } else { "read" }
            ),
            Stop::Budget { pc } => write!(f, "pc {pc}: instruction budget exhausted"),
            Stop::UnknownCallx { pc, id } => {
                write!(f, "pc {pc}: callx to helper id {id} (no helper registered)")
            }
        }
    }
}

impl std::error::Error for Stop {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_their_codes_and_stops_name_pc_and_details() {
        for k in [
            StopKind::OutOfBounds,
            StopKind::Budget,
            StopKind::UnknownCallx,
        ] {
            assert_eq!(StopKind::from_code(k.code()), Some(k));
        }
        assert_eq!(StopKind::from_code(crate::abi::PJ_STOP_NONE), None);
        assert_eq!(StopKind::from_code(99), None);
        let read = Stop::OutOfBounds {
            pc: 2,
            addr: 0x17,
            size: 1,
            write: false,
        };
        assert_eq!(read.direction(), Some(AccessDirection::Read));
        assert!(read
            .to_string()
            .starts_with("pc 2: out of bounds: 1-byte read at 0x17"));
        let b = Stop::Budget { pc: 3 };
        assert_eq!(
            (b.kind(), b.pc(), b.direction()),
            (StopKind::Budget, 3, None)
        );
        assert_eq!(b.to_string(), "pc 3: instruction budget exhausted");
        let c = Stop::UnknownCallx { pc: 2, id: 99 };
        assert_eq!(c.kind(), StopKind::UnknownCallx);
        assert_eq!(
            c.to_string(),
            "pc 2: callx to helper id 99 (no helper registered)"
        );
    }
}
