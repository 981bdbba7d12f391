//! Frames: `u32 length | u8 type | payload`, length counting type and payload.

use crate::codec::DecodeError;

/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u16 = 16;
/// Magic that opens a client's HELLO.
pub const MAGIC: u32 = 0x4F4C_4F53; // "SOLO" little-endian
/// Largest frame either side sends or accepts (length field value).
pub const MAX_FRAME: u32 = 16 << 20;
/// Largest frame a server accepts before the client has authenticated:
/// HELLO and AUTH (a MAC, a client id and a key name) fit many times over,
/// so an unauthenticated socket can make the server hold no more than this.
pub const PREAUTH_FRAME: u32 = 4 << 10;
/// Most requests in one REQUESTS frame.
pub const MAX_BATCH: u32 = 4096;

/// Frame types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// Client → server: magic, version.
    Hello = 1,
    /// Server → client: version, nonce, volume id.
    Challenge = 2,
    /// Client → server: HMAC over the challenge.
    Auth = 3,
    /// Server → client: handshake done; limits.
    Welcome = 4,
    /// Client → server: a batch of requests.
    Requests = 5,
    /// Server → client: a batch of replies.
    Replies = 6,
    /// Either way: a fatal error; the connection closes after it.
    Error = 7,
    /// Server → client: notices of changes (docs/protocol.md §8).
    Notices = 8,
}

impl FrameType {
    /// Decodes a type byte.
    pub fn from_u8(b: u8) -> Option<FrameType> {
        Some(match b {
            1 => FrameType::Hello,
            2 => FrameType::Challenge,
            3 => FrameType::Auth,
            4 => FrameType::Welcome,
            5 => FrameType::Requests,
            6 => FrameType::Replies,
            7 => FrameType::Error,
            8 => FrameType::Notices,
            _ => return None,
        })
    }
}

/// Appends a frame of `ty` whose payload `body` writes.
pub fn put_frame(out: &mut Vec<u8>, ty: FrameType, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, ty as u8]);
    body(out);
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// A complete frame found in a buffer: type, payload, bytes it occupied.
pub type Split<'a> = (FrameType, &'a [u8], usize);

/// Splits the first complete frame off `buf`: Ok(None) if more bytes are
/// needed, else (type, payload, bytes consumed). Errors on an oversized or
/// empty length or an unknown type.
pub fn split_frame(buf: &[u8], max: u32) -> Result<Option<Split<'_>>, DecodeError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len == 0 {
        return Err(DecodeError("empty frame"));
    }
    if len > max {
        return Err(DecodeError("frame larger than the maximum"));
    }
    if buf.len() < 4 + len as usize {
        return Ok(None);
    }
    let ty = FrameType::from_u8(buf[4]).ok_or(DecodeError("unknown frame type"))?;
    Ok(Some((ty, &buf[5..4 + len as usize], 4 + len as usize)))
}
