//! Notices: what a server tells a client without being asked (a NOTICES
//! frame, between reply frames). The server notes which inodes each
//! connection may hold in a cache (it sent their attributes, or looked a
//! name up in them); when another connection changes one, the holders are
//! told, and a mount drops what its kernel cached (docs/data.md,
//! "Consistency between mounts").

use crate::codec::{DecodeError, Reader, Writer};
use crate::fields::NAME;

/// One notice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The name `name` in directory `parent` changed (made, removed,
    /// renamed): a cached lookup of it, positive or negative, is stale,
    /// and so are the directory's attributes.
    Entry {
        /// The directory.
        parent: u64,
        /// The name in it.
        name: Vec<u8>,
    },
    /// The attributes or data of `ino` changed.
    Inode {
        /// The inode.
        ino: u64,
    },
    /// Something a reply of the batch that follows (or of one in flight)
    /// carries may have changed while it ran: do not cache those replies.
    Stale,
    /// The server watches no more inodes for this connection (it holds
    /// its limit): cache briefly until [`crate::Op::Rewatch`].
    Full,
    /// The server forgot what it watched for this connection and watches
    /// again from here (the answer to [`crate::Op::Rewatch`]).
    Watching,
    /// Made by the client, never sent: the connection was lost and a new
    /// one starts with nothing watched.
    Lost,
    /// The waiting lock request `token` of this client is granted (the
    /// server holds the lock for it now).
    Granted {
        /// The request's token.
        token: u64,
    },
    /// The server no longer watches `ino` for this connection (it let it
    /// go at its watch cap, least recently used first): what the client
    /// keeps of it must go, as after a change. Not a change: replies in
    /// flight about other inodes are not affected (since version 14).
    Unwatched {
        /// The inode.
        ino: u64,
    },
    /// The locks of `ino` delegated to this client are wanted by another
    /// client: hand them back (`LockReturn`) and decide them no more.
    Recall {
        /// The file.
        ino: u64,
    },
}

const ENTRY: u8 = 1;
const INODE: u8 = 2;
const STALE: u8 = 3;
const FULL: u8 = 4;
const LOST: u8 = 5;
const WATCHING: u8 = 6;
const GRANTED: u8 = 7;
const UNWATCHED: u8 = 8;
const RECALL: u8 = 9;

impl Notice {
    /// Appends the encoded notice.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        match self {
            Notice::Entry { parent, name } => {
                w.u8(ENTRY);
                w.u64(*parent);
                w.bytes(name);
            }
            Notice::Inode { ino } => {
                w.u8(INODE);
                w.u64(*ino);
            }
            Notice::Stale => w.u8(STALE),
            Notice::Full => w.u8(FULL),
            Notice::Lost => w.u8(LOST),
            Notice::Watching => w.u8(WATCHING),
            Notice::Granted { token } => {
                w.u8(GRANTED);
                w.u64(*token);
            }
            Notice::Unwatched { ino } => {
                w.u8(UNWATCHED);
                w.u64(*ino);
            }
            Notice::Recall { ino } => {
                w.u8(RECALL);
                w.u64(*ino);
            }
        }
    }

    /// Decodes one notice.
    pub fn decode(r: &mut Reader) -> Result<Notice, DecodeError> {
        Ok(match r.u8()? {
            ENTRY => Notice::Entry {
                parent: r.u64()?,
                name: r.bytes(NAME)?.to_vec(),
            },
            INODE => Notice::Inode { ino: r.u64()? },
            STALE => Notice::Stale,
            FULL => Notice::Full,
            LOST => Notice::Lost,
            WATCHING => Notice::Watching,
            GRANTED => Notice::Granted { token: r.u64()? },
            UNWATCHED => Notice::Unwatched { ino: r.u64()? },
            RECALL => Notice::Recall { ino: r.u64()? },
            _ => return Err(DecodeError("bad notice kind")),
        })
    }
}

/// Appends a NOTICES frame with `list`.
pub fn put_notices(out: &mut Vec<u8>, list: &[Notice]) {
    crate::frame::put_frame(out, crate::frame::FrameType::Notices, |b| {
        b.extend_from_slice(&(list.len() as u32).to_le_bytes());
        for n in list {
            n.encode(b);
        }
    });
}

/// Decodes a NOTICES frame payload.
pub fn decode_notices(payload: &[u8]) -> Result<Vec<Notice>, DecodeError> {
    let mut r = Reader::new(payload);
    let n = r.u32()? as usize;
    if n > payload.len() {
        return Err(DecodeError("count larger than the frame"));
    }
    let v = (0..n)
        .map(|_| Notice::decode(&mut r))
        .collect::<Result<Vec<_>, _>>()?;
    r.end()?;
    Ok(v)
}

/// Where a server delivers the notices of a client in its own process.
pub type NoticeSink = std::sync::Arc<dyn Fn(&[Notice]) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_bad_ones_are_refused() {
        let list = vec![
            Notice::Entry {
                parent: 9,
                name: b"a.txt".to_vec(),
            },
            Notice::Inode { ino: 12 },
            Notice::Stale,
            Notice::Full,
            Notice::Watching,
            Notice::Unwatched { ino: 77 },
            Notice::Granted { token: 77 },
            Notice::Recall { ino: 78 },
        ];
        let mut f = Vec::new();
        put_notices(&mut f, &list);
        let (ty, payload, n) = crate::split_frame(&f, crate::MAX_FRAME).unwrap().unwrap();
        assert_eq!(ty, crate::FrameType::Notices);
        assert_eq!(n, f.len());
        assert_eq!(decode_notices(payload).unwrap(), list);
        assert!(decode_notices(&payload[..payload.len() - 1]).is_err());
        let mut bad = payload.to_vec();
        bad[4] = 99;
        assert!(decode_notices(&bad).is_err());
        let mut long = 2u32.to_le_bytes().to_vec();
        long.push(ENTRY);
        long.extend_from_slice(&1u64.to_le_bytes());
        long.extend_from_slice(&(NAME as u32 + 1).to_le_bytes());
        long.extend(std::iter::repeat_n(b'x', NAME + 1));
        assert!(decode_notices(&long).is_err(), "an over-long name");
    }
}
