//! Directory summaries and quotas (docs/summaries.md): every change is
//! counted in the directories above it at once; a restart (clean or
//! `kill -9`) counts the same; a quota refuses with EDQUOT what would
//! exceed it, through the library and through a mount, whose `df` inside
//! the directory shows the quota.

mod common;

use common::*;
use solofs_client::{at, Client, Target};
use solofs_meta::errno::{EDQUOT, ENODATA, EPERM};
use solofs_meta::{Cred, SetAttr, ROOT_INO, S_IFDIR, S_IFMT, S_IFREG};
use std::collections::HashSet;
use std::process::Command;

/// (bytes, files, directories) below `dir`, as the server says.
fn summary(c: &Client, dir: u64) -> (i64, i64, i64) {
    let r = Cred::root();
    let get = |n: &[u8]| -> i64 {
        let v = c.getxattr(&r, Target::Ino(dir), n).unwrap();
        String::from_utf8(v).unwrap().parse().unwrap()
    };
    let entries = get(b"solofs.rentries");
    let (b, f, d) = (
        get(b"solofs.rsize"),
        get(b"solofs.rfiles"),
        get(b"solofs.rsubdirs"),
    );
    assert_eq!(entries, f + d);
    (b, f, d)
}

/// The same, counted by walking the tree below `dir` (each inode once).
fn walked(c: &Client, dir: u64, seen: &mut HashSet<u64>) -> (i64, i64, i64) {
    let r = Cred::root();
    let mut out = (0, 0, 0);
    let mut cookie = 0;
    loop {
        let (page, end) = c
            .readdir_plus_page(&r, Target::Ino(dir), cookie, 1000)
            .unwrap();
        for (d, a) in &page {
            cookie = d.cookie;
            if d.name == b"." || d.name == b".." || !seen.insert(a.ino) {
                continue;
            }
            if a.mode & S_IFMT == S_IFDIR {
                let s = walked(c, a.ino, seen);
                out = (out.0 + s.0, out.1 + s.1, out.2 + s.2 + 1);
            } else {
                out.1 += 1;
                if a.mode & S_IFMT == S_IFREG {
                    out.0 += a.size as i64;
                }
            }
        }
        if end || page.is_empty() {
            return out;
        }
    }
}

fn truncate(c: &Client, ino: u64, size: u64) -> Result<(), i32> {
    let sa = SetAttr {
        size: Some(size),
        ..Default::default()
    };
    c.setattr(&Cred::root(), Target::Ino(ino), sa)
        .map(|_| ())
        .map_err(|e| e.errno())
}

/// A server of the volume in `s` and a client of it, once the server's
/// summaries are built (a start walks the volume first).
fn serve(s: &Scratch) -> (ServerProc, Client) {
    let server = ServerProc::start(&s.path);
    let c = Client::connect(&server.addr, &s.secret()).unwrap();
    within(
        "summaries built",
        std::time::Duration::from_secs(20),
        || {
            c.getxattr(&Cred::root(), Target::Ino(ROOT_INO), b"solofs.rsize")
                .is_ok()
        },
    );
    (server, c)
}

/// Runs `solofs ARGS… --server … --secret-file …` for `s` served by
/// `server`.
fn admin(s: &Scratch, server: &ServerProc, args: &[&str]) -> String {
    solofs_via(&server.addr, &s.path.join("secret"), args)
}

#[test]
fn every_change_counts_at_once_and_a_restart_counts_the_same() {
    let s = Scratch::without_trash("sum-changes");
    let (server, c) = serve(&s);
    let r = Cred::root();
    let a = c.mkdir(&r, at(ROOT_INO, b"a"), 0o755).unwrap().ino;
    let b = c.mkdir(&r, at(a, b"b"), 0o755).unwrap().ino;
    let x = c.mkdir(&r, at(ROOT_INO, b"x"), 0o755).unwrap().ino;
    let f1 = c.create(&r, at(b, b"f1"), 0o644).unwrap().ino;
    truncate(&c, f1, 1000).unwrap();
    let f2 = c.create(&r, at(a, b"f2"), 0o644).unwrap().ino;
    truncate(&c, f2, 24).unwrap();
    c.symlink(&r, at(b, b"l"), b"f1").unwrap();
    assert_eq!(summary(&c, b), (1000, 2, 0));
    assert_eq!(summary(&c, a), (1024, 3, 1));
    assert_eq!(summary(&c, ROOT_INO), (1024, 3, 3));
    // A hard link counts once, where the file's own entry is.
    c.link(&r, Target::Ino(f1), at(x, b"f1-again")).unwrap();
    assert_eq!(summary(&c, x), (0, 0, 0));
    // Sizes change; a file and a directory move; names go.
    truncate(&c, f1, 10).unwrap();
    assert_eq!(summary(&c, a), (34, 3, 1));
    c.rename(&r, at(a, b"f2"), at(x, b"f2"), 0).unwrap();
    assert_eq!((summary(&c, a), summary(&c, x)), ((10, 2, 1), (24, 1, 0)));
    c.rename(&r, at(a, b"b"), at(x, b"b"), 0).unwrap();
    assert_eq!((summary(&c, a), summary(&c, x)), ((0, 0, 0), (34, 3, 1)));
    // Replacing a file frees what it counted.
    let f3 = c.create(&r, at(x, b"f3"), 0o644).unwrap().ino;
    truncate(&c, f3, 5).unwrap();
    c.rename(&r, at(x, b"f3"), at(x, b"f2"), 0).unwrap();
    assert_eq!(summary(&c, x), (15, 3, 1));
    c.unlink(&r, at(b, b"l")).unwrap();
    c.unlink(&r, at(x, b"f1-again")).unwrap();
    c.rmdir(&r, at(ROOT_INO, b"a")).unwrap();
    assert_eq!(summary(&c, ROOT_INO), (15, 2, 2));
    // Files are not directories; a quota is not there unless set.
    let e = c
        .getxattr(&r, Target::Ino(f1), b"solofs.rsize")
        .unwrap_err();
    assert_eq!(e.errno(), ENODATA);
    let e = c.getxattr(&r, Target::Ino(x), b"solofs.quota").unwrap_err();
    assert_eq!(e.errno(), ENODATA);
    // The summaries are read-only.
    let e = c
        .setxattr(&r, Target::Ino(x), b"solofs.rsize", b"1", 0)
        .unwrap_err();
    assert_eq!(e.errno(), EPERM);

    // More, at random, then checked against a walk.
    let mut rng = Rng(7);
    let mut dirs = vec![ROOT_INO, x, b];
    let mut files = Vec::new();
    for i in 0..400 {
        let d = dirs[rng.below(dirs.len() as u64) as usize];
        match rng.below(6) {
            0 => dirs.push(
                c.mkdir(&r, at(d, format!("d{i}").as_bytes()), 0o755)
                    .unwrap()
                    .ino,
            ),
            1 if !files.is_empty() => {
                let (fd, name, _): (u64, String, u64) =
                    files.swap_remove(rng.below(files.len() as u64) as usize);
                c.unlink(&r, at(fd, name.as_bytes())).unwrap();
            }
            2 if !files.is_empty() => {
                let k = rng.below(files.len() as u64) as usize;
                let (fd, name, ino) = files[k].clone();
                let to = format!("m{i}");
                c.rename(&r, at(fd, name.as_bytes()), at(d, to.as_bytes()), 0)
                    .unwrap();
                files[k] = (d, to, ino);
            }
            _ => {
                let name = format!("f{i}");
                let ino = c.create(&r, at(d, name.as_bytes()), 0o644).unwrap().ino;
                truncate(&c, ino, rng.below(100_000)).unwrap();
                files.push((d, name, ino));
            }
        }
    }
    let want = walked(&c, ROOT_INO, &mut HashSet::new());
    assert_eq!(summary(&c, ROOT_INO), want);
    let wx = walked(&c, x, &mut HashSet::new());
    assert_eq!(summary(&c, x), wx);
    drop(c);

    // A clean restart, then a kill -9: the same counts.
    assert!(server.stop().success());
    let (server, c) = serve(&s);
    assert_eq!((summary(&c, ROOT_INO), summary(&c, x)), (want, wx));
    drop(c);
    server.kill();
    let (server, c) = serve(&s);
    assert_eq!((summary(&c, ROOT_INO), summary(&c, x)), (want, wx));
    // `solofs info` says the same through the server.
    let out = admin(&s, &server, &["info", "/x"]);
    assert!(out.contains(&format!("files:       {}", wx.1)), "{out}");
    assert!(out.contains(&format!("directories: {}", wx.2)), "{out}");
    assert!(
        out.contains(&format!("({} B)", wx.0)) || wx.0 < 1024,
        "{out}"
    );
    // gc counts again and finds them as kept; status says what they hold.
    let out = admin(&s, &server, &["gc"]);
    assert!(
        out.contains("directory summaries: walked again, all as kept"),
        "{out}"
    );
    let out = admin(&s, &server, &["status"]);
    assert!(
        out.contains(&format!(
            "summary  {} bytes, {} files, {} directories below /; 0 quotas",
            want.0, want.1, want.2
        )),
        "{out}"
    );
    drop(c);
    assert!(server.stop().success());
    // fsck counts what the walk at start counts.
    let out = solofs(&["fsck", "--data", s.path.to_str().unwrap()]);
    assert!(
        out.contains(&format!(
            "below /: {} bytes of regular files, {} files, {} directories; 0 quotas",
            want.0, want.1, want.2
        )),
        "{out}"
    );
}

#[test]
fn a_quota_refuses_what_would_exceed_it_and_outlives_a_restart() {
    let s = Scratch::without_trash("sum-quota");
    let (server, c) = serve(&s);
    let r = Cred::root();
    let q = c.mkdir(&r, at(ROOT_INO, b"q"), 0o777).unwrap().ino;
    let inner = c.mkdir(&r, at(q, b"inner"), 0o777).unwrap().ino;
    let outside = c.create(&r, at(ROOT_INO, b"big"), 0o644).unwrap().ino;
    truncate(&c, outside, 5000).unwrap();
    let out = admin(
        &s,
        &server,
        &["quota", "set", "/q", "--space", "4K", "--inodes", "4"],
    );
    assert!(out.contains("space 0 B of 4.0 KiB (4096 B)"), "{out}");
    assert!(out.contains("inodes 1 of 4"), "{out}");
    // Inodes: 1 used (inner), 3 more fit.
    let f = c.create(&r, at(inner, b"f"), 0o644).unwrap().ino;
    c.mkdir(&r, at(q, b"d"), 0o755).unwrap();
    c.symlink(&r, at(q, b"s"), b"f").unwrap();
    let e = c.create(&r, at(inner, b"g"), 0o644).unwrap_err();
    assert_eq!(e.errno(), EDQUOT);
    let e = c.mkdir(&r, at(q, b"e"), 0o755).unwrap_err();
    assert_eq!(e.errno(), EDQUOT);
    // Space: growing past 4 KiB is refused, by setattr and by a writer's
    // commit; shrinking always works.
    truncate(&c, f, 4096).unwrap();
    assert_eq!(truncate(&c, f, 4097), Err(EDQUOT));
    let e = c.write_commit(&r, f, 5000, 1).unwrap_err();
    assert_eq!(e.errno(), EDQUOT);
    truncate(&c, f, 100).unwrap();
    // A move into the quota counts; a move inside it does not.
    let e = c
        .rename(&r, at(ROOT_INO, b"big"), at(q, b"big"), 0)
        .unwrap_err();
    assert_eq!(e.errno(), EDQUOT);
    c.rename(&r, at(inner, b"f"), at(q, b"f"), 0).unwrap();
    // Outside the quota nothing is limited.
    c.create(&r, at(ROOT_INO, b"free"), 0o644).unwrap();
    // Only root sets quotas.
    let user = Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    };
    let e = c
        .setxattr(
            &user,
            Target::Ino(inner),
            b"trusted.solofs.quota",
            b"inodes=1",
            0,
        )
        .unwrap_err();
    assert_eq!(e.errno(), EPERM);
    let e = c
        .setxattr(&r, Target::Ino(inner), b"trusted.solofs.quota", b"nope", 0)
        .unwrap_err();
    assert_eq!(e.errno(), solofs_meta::errno::EINVAL);
    let list = admin(&s, &server, &["quota", "list"]);
    assert!(
        list.contains("/q: space 100 B of 4.0 KiB (4096 B)"),
        "{list}"
    );
    // The metrics page has each quota's limits and use.
    let page = metrics_page(&server.metrics);
    for line in [
        "solofs_quota_inodes_limit{dir=\"/q\"} 4",
        "solofs_quota_inodes_used{dir=\"/q\"} 4",
        "solofs_quota_space_limit_bytes{dir=\"/q\"} 4096",
        "solofs_quota_space_used_bytes{dir=\"/q\"} 100",
    ] {
        assert!(page.contains(line), "{line} not in:\n{page}");
    }
    drop(c);

    // Kept across a restart, with the same use.
    server.kill();
    let (server, c) = serve(&s);
    let out = admin(&s, &server, &["quota", "get", "/q"]);
    assert!(
        out.contains("space 100 B of 4.0 KiB (4096 B), inodes 4 of 4"),
        "{out}"
    );
    let e = c.create(&r, at(q, b"g"), 0o644).unwrap_err();
    assert_eq!(e.errno(), EDQUOT);
    admin(&s, &server, &["quota", "delete", "/q"]);
    c.create(&r, at(q, b"g"), 0o644).unwrap();
    assert!(admin(&s, &server, &["quota", "list"]).contains("no quotas"));
    drop(c);
    assert!(server.stop().success());
}

#[test]
fn through_a_mount_info_reads_the_summaries_and_df_shows_the_quota() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let s = Scratch::without_trash("sum-mount");
    let server = ServerProc::start(&s.path);
    let mnt = std::env::temp_dir().join(format!("solofs-sum-mnt-{}", std::process::id()));
    let m = MountProc::start(&server.addr, &s.path.join("secret"), &mnt, &[]);
    let q = mnt.join("q");
    std::fs::create_dir_all(q.join("sub")).unwrap();
    std::fs::write(q.join("sub/a"), vec![1u8; 3000]).unwrap();
    std::fs::write(q.join("b"), vec![2u8; 1000]).unwrap();
    admin(
        &s,
        &server,
        &["quota", "set", "/q", "--space", "1M", "--inodes", "100"],
    );
    // `solofs info` of a directory on the mount (its extended attributes).
    let out = solofs(&["info", q.to_str().unwrap()]);
    assert!(out.contains("(4000 B)"), "{out}");
    assert!(out.contains("files:       2"), "{out}");
    assert!(out.contains("directories: 1"), "{out}");
    // df inside the directory: the quota is the size, its use the use.
    let df = Command::new("df")
        .args(["-B1", "--output=size,used,itotal,iused"])
        .arg(q.join("sub"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&df.stdout);
    let nums: Vec<u64> = text
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(nums[0], 1 << 20, "{text}");
    assert_eq!(nums[2], 100, "{text}");
    assert_eq!(nums[3], 3, "{text}");
    // A write past the quota fails with EDQUOT ("Disk quota exceeded").
    // (Reported by the write or by the fsync that stores it: a close's
    // error is dropped by std.)
    let r = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(q.join("huge"))?;
        f.write_all(&vec![3u8; 2 << 20])?;
        f.sync_all()
    })();
    assert_eq!(
        r.unwrap_err().raw_os_error(),
        Some(EDQUOT),
        "a 2 MiB write under a 1 MiB quota"
    );
    drop(m);
    assert!(server.stop().success());
    let _ = std::fs::remove_dir_all(&mnt);
}

#[test]
fn a_user_or_group_quota_counts_what_it_owns_anywhere() {
    let s = Scratch::without_trash("sum-owner");
    let (server, c) = serve(&s);
    let r = Cred::root();
    let u = Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    };
    let a = c.mkdir(&r, at(ROOT_INO, b"a"), 0o777).unwrap().ino;
    let b = c.mkdir(&r, at(ROOT_INO, b"b"), 0o777).unwrap().ino;
    let f = c.create(&u, at(a, b"f"), 0o644).unwrap().ino;
    truncate(&c, f, 3000).unwrap();
    admin(
        &s,
        &server,
        &[
            "quota", "set", "--uid", "1000", "--inodes", "3", "--space", "4K",
        ],
    );
    let out = admin(&s, &server, &["quota", "get", "--uid", "1000"]);
    assert!(
        out.contains("user 1000: space 2.9 KiB (3000 B) of 4.0 KiB (4096 B), inodes 1 of 3"),
        "{out}"
    );
    // In any directory: two more inodes, then EDQUOT; root is not limited.
    c.create(&u, at(b, b"g"), 0o644).unwrap();
    c.mkdir(&u, at(a, b"d"), 0o755).unwrap();
    assert_eq!(
        c.create(&u, at(b, b"h"), 0o644).unwrap_err().errno(),
        EDQUOT
    );
    c.create(&r, at(b, b"h"), 0o644).unwrap();
    // Bytes it owns, wherever the file is.
    assert_eq!(truncate(&c, f, 5000), Err(EDQUOT));
    // A chown to it counts; a group quota too.
    let h = c.lookup(&r, at(b, b"h")).unwrap().ino;
    let give = SetAttr {
        uid: Some(1000),
        ..Default::default()
    };
    let e = c.setattr(&r, Target::Ino(h), give).unwrap_err();
    assert_eq!(e.errno(), EDQUOT);
    admin(&s, &server, &["quota", "delete", "--uid", "1000"]);
    admin(
        &s,
        &server,
        &["quota", "set", "--gid", "1000", "--inodes", "4"],
    );
    c.create(&u, at(b, b"i"), 0o644).unwrap();
    assert_eq!(
        c.create(&u, at(b, b"j"), 0o644).unwrap_err().errno(),
        EDQUOT
    );
    let list = admin(&s, &server, &["quota", "list"]);
    assert!(
        list.contains("group 1000: space 2.9 KiB (3000 B) (no limit), inodes 4 of 4"),
        "{list}"
    );
    drop(c);
    // Kept across a restart, with the same use.
    server.kill();
    let (server, c) = serve(&s);
    assert_eq!(
        c.create(&u, at(b, b"j"), 0o644).unwrap_err().errno(),
        EDQUOT
    );
    let out = admin(&s, &server, &["quota", "get", "--gid", "1000"]);
    assert!(out.contains("inodes 4 of 4"), "{out}");
    drop(c);
    assert!(server.stop().success());
}
