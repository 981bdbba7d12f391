//! Malformed, truncated and oversized frames, a bad handshake, a wrong
//! secret and unknown operation codes get an ERROR frame or a closed
//! connection; the server keeps serving other clients and the namespace is
//! unchanged.

mod common;

use common::{Scratch, ServerProc};
use solofs_client::{at, Client, ClientError, Target};
use solofs_meta::{Cred, ROOT_INO};
use solofs_proto::{
    auth_mac, put_frame, split_frame, FrameType, Reader, Writer, MAGIC, MAX_FRAME, PROTOCOL_VERSION,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn raw(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads until the server closes; returns the frame types it sent.
fn drain(mut s: TcpStream) -> Vec<FrameType> {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let mut types = Vec::new();
    let mut at = 0;
    while let Ok(Some((ty, _, n))) = split_frame(&buf[at..], MAX_FRAME) {
        types.push(ty);
        at += n;
    }
    types
}

fn hello() -> Vec<u8> {
    let mut out = Vec::new();
    put_frame(&mut out, FrameType::Hello, |b| {
        let mut w = Writer(b);
        w.u32(MAGIC);
        w.u16(PROTOCOL_VERSION);
    });
    out
}

/// A raw connection that completed the handshake.
fn authed(addr: &str, secret: &[u8]) -> TcpStream {
    let mut s = raw(addr);
    s.write_all(&hello()).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let (ty, p, _) = split_frame(&buf[..n], MAX_FRAME).unwrap().unwrap();
    assert_eq!(ty, FrameType::Challenge);
    let mut r = Reader::new(p);
    r.u16().unwrap();
    let nonce = r.take(32).unwrap().to_vec();
    let vol = r.take(16).unwrap().to_vec();
    let mut out = Vec::new();
    put_frame(&mut out, FrameType::Auth, |b| {
        b.extend_from_slice(&auth_mac(secret, &nonce, &vol))
    });
    s.write_all(&out).unwrap();
    let n = s.read(&mut buf).unwrap();
    assert_eq!(
        split_frame(&buf[..n], MAX_FRAME).unwrap().unwrap().0,
        FrameType::Welcome
    );
    s
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = Scratch::new("bad");
    let mut srv = ServerProc::start(&s.path);
    let secret = s.secret();
    let r = Cred::root();
    let good = Client::connect(&srv.addr, &secret).unwrap();
    good.mkdir(&r, at(ROOT_INO, b"keep"), 0o755).unwrap();
    let before = good.readdir(&r, Target::Ino(ROOT_INO), 0, 100).unwrap();

    // Garbage instead of a handshake.
    let mut c = raw(&srv.addr);
    c.write_all(b"GET / HTTP/1.1\r\n\r\nthis is not solofs")
        .unwrap();
    assert_eq!(drain(c), vec![FrameType::Error]); // "GET " reads as an oversized length
                                                  // Wrong magic.
    let mut c = raw(&srv.addr);
    let mut f = Vec::new();
    put_frame(&mut f, FrameType::Hello, |b| {
        b.extend_from_slice(&[1, 2, 3, 4, 1, 0])
    });
    c.write_all(&f).unwrap();
    assert_eq!(drain(c), vec![FrameType::Error]);
    // A frame claiming to be larger than the limit.
    let mut c = raw(&srv.addr);
    c.write_all(&(MAX_FRAME + 1).to_le_bytes()).unwrap();
    c.write_all(&[1u8; 16]).unwrap();
    assert_eq!(drain(c), vec![FrameType::Error]);
    // Truncated frame, then the client goes away.
    let mut c = raw(&srv.addr);
    let h = hello();
    c.write_all(&h[..h.len() - 2]).unwrap();
    drop(c);
    // Wrong secret: refused with a clear message.
    match Client::connect(&srv.addr, b"not the secret") {
        Err(ClientError::Refused(m)) => assert!(m.contains("wrong volume secret"), "{m}"),
        Err(e) => panic!("wrong secret gave {e}"),
        Ok(_) => panic!("wrong secret accepted"),
    }
    // Requests before authenticating.
    let mut c = raw(&srv.addr);
    let mut f = Vec::new();
    put_frame(&mut f, FrameType::Requests, |b| {
        b.extend_from_slice(&0u32.to_le_bytes())
    });
    c.write_all(&f).unwrap();
    assert_eq!(drain(c), vec![FrameType::Error]);
    // After authenticating: an unknown operation code gets an EOPNOTSUPP
    // reply and the connection closes.
    let mut c = authed(&srv.addr, &secret);
    let mut f = Vec::new();
    put_frame(&mut f, FrameType::Requests, |b| {
        let mut w = Writer(b);
        w.u32(1);
        w.u64(77);
        w.u16(999);
        w.u32(0);
        w.u32(0);
        w.u8(0);
    });
    c.write_all(&f).unwrap();
    assert_eq!(drain(c), vec![FrameType::Replies, FrameType::Error]);
    // A request whose fields lie about their lengths.
    let mut c = authed(&srv.addr, &secret);
    let mut f = Vec::new();
    put_frame(&mut f, FrameType::Requests, |b| {
        let mut w = Writer(b);
        w.u32(1);
        w.u64(1);
        w.u16(4); // create
        w.u32(0);
        w.u32(0);
        w.u8(0);
        w.u8(0); // Loc::At
        w.u64(ROOT_INO);
        w.u32(u32::MAX); // name length far beyond the frame
    });
    c.write_all(&f).unwrap();
    assert_eq!(drain(c), vec![FrameType::Error]);
    // A count larger than the frame.
    let mut c = authed(&srv.addr, &secret);
    let mut f = Vec::new();
    put_frame(&mut f, FrameType::Requests, |b| {
        b.extend_from_slice(&5000u32.to_le_bytes())
    });
    c.write_all(&f).unwrap();
    assert_eq!(drain(c), vec![FrameType::Error]);

    // The good client was never disturbed, and nothing changed.
    assert!(srv.alive());
    let after = good.readdir(&r, Target::Ino(ROOT_INO), 0, 100).unwrap();
    assert_eq!(before, after);
    good.noop().unwrap();
    let metrics = std::process::Command::new(common::BIN)
        .args(["stats", &srv.metrics, "--count", "1", "--interval", "0.1"])
        .output()
        .unwrap();
    assert!(metrics.status.success());
    assert!(srv.stop().success());
}
