//! The handshake's frames (docs/protocol.md §2), encoded and decoded here
//! and nowhere else: HELLO (client), CHALLENGE (server), AUTH (client),
//! WELCOME (server).

use crate::codec::{DecodeError, Reader, Writer};
use crate::frame::{put_frame, FrameType, MAGIC, MAX_BATCH, MAX_FRAME, PROTOCOL_VERSION};
use crate::{Welcome, KEY_NAME_MAX, NONCE_LEN};

/// HELLO: the magic number and the protocol version the client speaks.
pub fn put_hello(out: &mut Vec<u8>) {
    put_frame(out, FrameType::Hello, |b| {
        let mut w = Writer(b);
        w.u32(MAGIC);
        w.u16(PROTOCOL_VERSION);
    });
}

/// Is HELLO's payload SoloFS's, of this protocol version?
pub fn hello_ok(payload: &[u8]) -> bool {
    let mut r = Reader::new(payload);
    r.u32().ok() == Some(MAGIC) && r.u16().ok() == Some(PROTOCOL_VERSION) && r.end().is_ok()
}

/// CHALLENGE: what the client proves it knows the secret over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// The server's protocol version.
    pub version: u16,
    /// A fresh nonce.
    pub nonce: [u8; NONCE_LEN],
    /// The volume's id.
    pub volume: [u8; 16],
}

impl Challenge {
    /// Appends the frame.
    pub fn put(&self, out: &mut Vec<u8>) {
        put_frame(out, FrameType::Challenge, |b| {
            let mut w = Writer(b);
            w.u16(self.version);
            w.raw(&self.nonce);
            w.raw(&self.volume);
        });
    }

    /// Decodes the frame's payload (a version other than this one's is
    /// the caller's to refuse).
    pub fn get(payload: &[u8]) -> Result<Challenge, DecodeError> {
        let mut r = Reader::new(payload);
        let version = r.u16()?;
        let mut nonce = [0; NONCE_LEN];
        let mut volume = [0; 16];
        if version == PROTOCOL_VERSION {
            nonce.copy_from_slice(r.take(NONCE_LEN)?);
            volume.copy_from_slice(r.take(16)?);
        }
        Ok(Challenge {
            version,
            nonce,
            volume,
        })
    }
}

/// AUTH: the client's proof, its id (for its reply record) and the name
/// of the client key it authenticates with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auth<'a> {
    /// HMAC-SHA256 over the challenge ([`crate::auth_mac`]).
    pub mac: [u8; 32],
    /// The client's id (optional on the wire).
    pub id: Option<[u8; 16]>,
    /// The client key's name (needs an id before it).
    pub key: Option<&'a [u8]>,
}

impl<'a> Auth<'a> {
    /// Appends the frame.
    pub fn put(&self, out: &mut Vec<u8>) {
        put_frame(out, FrameType::Auth, |b| {
            b.extend_from_slice(&self.mac);
            if let Some(id) = &self.id {
                b.extend_from_slice(id);
                if let Some(k) = self.key {
                    Writer(b).bytes(k);
                }
            }
        });
    }

    /// Decodes the frame's payload.
    pub fn get(payload: &'a [u8]) -> Result<Auth<'a>, DecodeError> {
        let mut r = Reader::new(payload);
        let mut mac = [0; 32];
        mac.copy_from_slice(r.take(32)?);
        let mut id = None;
        let mut key = None;
        if r.end().is_err() {
            let mut i = [0; 16];
            i.copy_from_slice(r.take(16)?);
            id = Some(i);
            if r.end().is_err() {
                key = Some(r.bytes(KEY_NAME_MAX)?);
            }
        }
        r.end()?;
        Ok(Auth { mac, id, key })
    }
}

impl Welcome {
    /// Appends the WELCOME frame: this volume, and `others` (how many
    /// other connections of the client are open).
    pub fn put(&self, out: &mut Vec<u8>, others: u32) {
        put_frame(out, FrameType::Welcome, |b| {
            let mut w = Writer(b);
            w.u32(MAX_FRAME);
            w.u32(MAX_BATCH);
            w.u64(self.root);
            w.u64(self.block_size);
            w.bytes(self.storage.as_bytes());
            w.u64(self.inline_max);
            w.u32(others);
            w.u8(u8::from(self.as_sent));
        });
    }

    /// Decodes WELCOME's payload for the volume whose id the challenge
    /// gave: the volume, and the client's other connections.
    pub fn get(payload: &[u8], id: [u8; 16]) -> Result<(Welcome, u32), DecodeError> {
        let mut r = Reader::new(payload);
        let _max_frame = r.u32()?;
        let _max_batch = r.u32()?;
        let root = r.u64()?;
        let block_size = r.u64()?;
        let storage = String::from_utf8_lossy(r.bytes(4096)?).into_owned();
        let inline_max = r.u64()?;
        let others = r.u32()?;
        let as_sent = r.u8()? & 1 != 0;
        let w = Welcome {
            id,
            root,
            block_size,
            storage,
            inline_max,
            as_sent,
        };
        Ok((w, others))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::split_frame;

    fn payload(frame: &[u8]) -> (FrameType, Vec<u8>) {
        let (ty, p, _) = split_frame(frame, MAX_FRAME).unwrap().unwrap();
        (ty, p.to_vec())
    }

    #[test]
    fn every_handshake_frame_reads_back_as_written() {
        let mut out = Vec::new();
        put_hello(&mut out);
        let (ty, p) = payload(&out);
        assert_eq!(ty, FrameType::Hello);
        assert!(hello_ok(&p));
        assert!(!hello_ok(&p[..5]));

        let c = Challenge {
            version: PROTOCOL_VERSION,
            nonce: [7; NONCE_LEN],
            volume: [9; 16],
        };
        out.clear();
        c.put(&mut out);
        assert_eq!(Challenge::get(&payload(&out).1), Ok(c));
        assert_eq!(
            Challenge::get(&(PROTOCOL_VERSION + 1).to_le_bytes()).map(|c| c.version),
            Ok(PROTOCOL_VERSION + 1),
            "another version is read, for the caller to refuse"
        );

        for a in [
            Auth {
                mac: [1; 32],
                id: None,
                key: None,
            },
            Auth {
                mac: [2; 32],
                id: Some([3; 16]),
                key: None,
            },
            Auth {
                mac: [4; 32],
                id: Some([5; 16]),
                key: Some(b"reader"),
            },
        ] {
            out.clear();
            a.put(&mut out);
            let p = payload(&out).1;
            assert_eq!(Auth::get(&p), Ok(a.clone()));
            assert!(Auth::get(&p[..p.len() - 1]).is_err());
        }

        let w = Welcome {
            id: [6; 16],
            root: 1,
            block_size: 4 << 20,
            storage: "file:///x".into(),
            inline_max: 4096,
            as_sent: true,
        };
        out.clear();
        w.put(&mut out, 3);
        assert_eq!(Welcome::get(&payload(&out).1, [6; 16]), Ok((w, 3)));
    }
}
