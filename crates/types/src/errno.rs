//! The errno numbers SoloFS crates name outside the engine (the engine's
//! `Error::errno` maps its own variants). Linux values, from `libc`.

pub use libc::{
    E2BIG, EACCES, EAGAIN, EBADF, EBUSY, ECONNRESET, EDQUOT, EEXIST, EFBIG, EINTR, EINVAL, EIO,
    EISDIR, ELOOP, EMLINK, ENAMETOOLONG, ENODATA, ENOENT, ENOSPC, ENOSYS, ENOTDIR, ENOTEMPTY,
    EOPNOTSUPP, EOVERFLOW, EPERM, ERANGE, EROFS, ESTALE, ETIMEDOUT, EXDEV,
};
