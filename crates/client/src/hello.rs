//! Connecting: the greeting, the challenge and the authentication
//! (docs/protocol.md §2), and reading a whole frame from a blocking stream.

use crate::{ClientError, Inner, Result, Volume};
use solofs_proto::{auth_mac, split_frame, FrameType, Reader, MAX_FRAME, PROTOCOL_VERSION};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

/// Reads until one whole frame is in `buf` and takes it out.
/// Most bytes one read of the connection takes.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// Reads one whole frame: its type and payload. `buf` keeps the bytes
/// read past it; `tmp` (any size) is where each read lands first.
pub(crate) fn read_frame(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    tmp: &mut [u8],
) -> Result<(FrameType, Vec<u8>)> {
    loop {
        if let Some((ty, payload, n)) =
            split_frame(buf, MAX_FRAME).map_err(|e| ClientError::Protocol(e.to_string()))?
        {
            let p = payload.to_vec();
            buf.drain(..n);
            return Ok((ty, p));
        }
        let n = s.read(tmp)?;
        if n == 0 {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            )));
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// The errno of an ERROR frame that refuses a client's credentials (a
/// revoked key).
pub(crate) const EACCES: u32 = 13;

/// The errno an ERROR frame carries.
pub(crate) fn error_errno(payload: &[u8]) -> Option<u32> {
    Reader::new(payload).u32().ok()
}

fn server_error(payload: &[u8]) -> ClientError {
    let mut r = Reader::new(payload);
    let _errno = r.u32();
    let msg = r
        .bytes(4096)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    ClientError::Refused(msg)
}

/// Connects and authenticates: the stream, the bytes read past the
/// WELCOME frame, what the server said of its volume, and how many other
/// connections of this client it serves (none: it keeps no waits of the
/// client, and maybe no locks, so they must be claimed again).
pub(crate) fn greet(inner: &Inner) -> Result<(TcpStream, Vec<u8>, Volume, u32)> {
    use std::sync::atomic::Ordering;
    // A replica set's members in turn: only its leader listens for
    // clients (a follower refuses the connection; a leader that lost its
    // office closes it).
    let members = members(&inner.addr);
    if members.len() <= 1 {
        return greet_one(inner, inner.addr.trim(), inner.opts.connect_timeout);
    }
    // A member whose machine is gone may not answer at all (no refusal):
    // the next member is tried after MEMBER_CONNECT, not after the whole
    // connect timeout (5 s by default, longer than a failover).
    let wait = inner.opts.connect_timeout.min(MEMBER_CONNECT);
    let first = inner.member.load(Ordering::Relaxed);
    let mut last = None;
    for k in 0..members.len() {
        let i = (first + k) % members.len();
        match greet_one(inner, members[i], wait) {
            Ok(r) => {
                inner.member.store(i, Ordering::Relaxed);
                return Ok(r);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| ClientError::Io(io::ErrorKind::NotFound.into())))
}

/// The servers in `addr`: one, or a replica set's members (`A,B,C`);
/// [`Inner::member`] indexes this list.
pub(crate) fn members(addr: &str) -> Vec<&str> {
    addr.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect()
}

/// Longest wait for a replica set member's TCP connection to be made.
const MEMBER_CONNECT: std::time::Duration = std::time::Duration::from_millis(500);

/// [`greet`] with one server at `at`, waiting at most `wait` for the
/// connection to be made.
fn greet_one(
    inner: &Inner,
    at: &str,
    wait: std::time::Duration,
) -> Result<(TcpStream, Vec<u8>, Volume, u32)> {
    let addr = at.to_socket_addrs()?.next().ok_or_else(|| {
        ClientError::Io(io::Error::new(
            io::ErrorKind::NotFound,
            "address resolves to nothing",
        ))
    })?;
    let mut s = TcpStream::connect_timeout(&addr, wait)?;
    s.set_nodelay(true)?;
    // (A member's greeting: twice the connection's wait, 1 s; a member
    // whose process stands still would hold every reconnect for the
    // whole connect timeout.)
    s.set_read_timeout(Some(inner.opts.connect_timeout.min(wait * 2)))?;
    let mut out = Vec::new();
    solofs_proto::put_hello(&mut out);
    s.write_all(&out)?;
    let mut buf = Vec::new();
    let mut tmp = vec![0u8; READ_CHUNK];
    let not_solofs = |why: String| {
        ClientError::Protocol(format!(
            "{at} does not answer as a SoloFS server ({why}); is it the right address and port?"
        ))
    };
    let (ty, p) = match read_frame(&mut s, &mut buf, &mut tmp) {
        Ok(f) => f,
        Err(ClientError::Protocol(why)) => return Err(not_solofs(why)),
        Err(ClientError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            // Worth trying again on a reconnect (a proxy whose server is
            // down, a server going away): not the protocol error of a
            // port that answers something else.
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{at} closed the connection before answering the greeting (a server stopping, a proxy without its server, or not a SoloFS server)"),
            )));
        }
        Err(ClientError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return Err(not_solofs("no reply to the greeting in time".into()))
        }
        Err(e) => return Err(e),
    };
    if ty == FrameType::Error {
        return Err(server_error(&p));
    }
    if ty != FrameType::Challenge {
        return Err(not_solofs(format!("its first frame is {ty:?}")));
    }
    let ch = solofs_proto::Challenge::get(&p)
        .map_err(|_| ClientError::Protocol("bad CHALLENGE".into()))?;
    if ch.version != PROTOCOL_VERSION {
        return Err(ClientError::Protocol(format!(
            "server speaks protocol {}",
            ch.version
        )));
    }
    // A client key names itself after the client id (docs/protocol.md §2).
    let (key, secret) = solofs_proto::split_key(&inner.secret);
    let auth = solofs_proto::Auth {
        mac: auth_mac(secret, &ch.nonce, &ch.volume),
        id: Some(inner.id),
        key,
    };
    out.clear();
    auth.put(&mut out);
    s.write_all(&out)?;
    let (ty, p) = read_frame(&mut s, &mut buf, &mut tmp)?;
    let (vol, others) = match ty {
        FrameType::Welcome => {
            Volume::get(&p, ch.volume).map_err(|_| ClientError::Protocol("bad WELCOME".into()))?
        }
        FrameType::Error => {
            // The credentials refused (EACCES): a revoked key.
            if error_errno(&p) == Some(EACCES) {
                inner
                    .revoked
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
            return Err(server_error(&p));
        }
        _ => return Err(ClientError::Protocol("expected WELCOME".into())),
    };
    Ok((s, buf, vol, others))
}
