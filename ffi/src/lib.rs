//! C API (see include/packjit.h).
