//! SoloFS data path: the blocks of regular files in an object store
//! (docs/design.md §5), through the `object_store` crate.
//!
//! A file's bytes `[b * block_size, (b + 1) * block_size)` are the object
//! `<volume>/<ino>/<b>` (volume id in hex, ino and block number in decimal)
//! under the storage URL's bucket and prefix. An object may be shorter than
//! a block: bytes past its end, and missing objects, read as zeros (holes).
//! Nothing here knows about sizes or names; the metadata server records
//! those, and decides which blocks may be deleted.
//!
//! Storage URLs: `file:///DIR` (a local directory, the embedded default) and
//! `s3://BUCKET[/PREFIX][?endpoint=URL&region=R&allow_http=true]`. S3
//! credentials never live in the URL (it is recorded in the volume and sent
//! to every client): they come from [`S3Credentials`] or the usual
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` environment variables.
//!
//! The API is blocking; one shared tokio runtime does the I/O, except that
//! a `file://` store's gets and short puts run in the calling thread (no
//! hand-off to a runtime thread and back). It must not be called from
//! inside an async task.

// The lint wall is the workspace's (Cargo.toml, docs/design.md §8); tests
// may unwrap.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{GetResult, GetResultPayload, ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// Errors of the data path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage URL cannot be used.
    #[error("storage URL {url}: {why}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The object store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// A background transfer died.
    #[error("background transfer: {0}")]
    Task(String),
    /// Reading a block from a local file failed.
    #[error("{0}")]
    Read(String),
}

impl Error {
    /// The errno a file system call should return for this error.
    pub fn errno(&self) -> i32 {
        const ENOSPC: i32 = 28;
        const EROFS: i32 = 30;
        const EDQUOT: i32 = 122;
        if let Error::Url { .. } = self {
            return 22; // EINVAL
        }
        // A full or read-only local store says so; anything else is EIO.
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                if let Some(e @ (ENOSPC | EROFS | EDQUOT)) = io.raw_os_error() {
                    return e;
                }
            }
            cause = c.source();
        }
        if self.to_string().contains("No space left on device") {
            return ENOSPC;
        }
        5 // EIO
    }
}

/// Result of the data path.
pub type Result<T> = std::result::Result<T, Error>;

/// S3 credentials given explicitly (config file), instead of the
/// environment.
#[derive(Clone, Debug, Default)]
pub struct S3Credentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
}

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        // One crypto provider for https endpoints, chosen here once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("solofs-data")
            .enable_all()
            .build()
            .unwrap_or_else(fatal)
    })
}

/// The blocks of one volume in one object store.
#[derive(Clone)]
pub struct BlockStore {
    store: Arc<dyn ObjectStore>,
    /// Its traffic (shared by clones).
    stats: Arc<StoreStats>,
    volume: String,
    block_size: u64,
    url: String,
    /// A `file://` store: its I/O is done by the calling thread ([`here`]).
    local: bool,
    /// A `file://` store's directory (its objects are files there, which
    /// [`BlockStore::patch`] writes in place).
    root: Option<std::path::PathBuf>,
    /// How long a block's put or get that failed for a passing reason
    /// (connection refused or reset, a timeout, a 5xx) is tried again
    /// before the error reaches the caller: an object store that hiccups
    /// (503 SlowDown, a restart) must not lose writes. Zero for `file://`
    /// (its errors, a full disk, do not pass by waiting).
    retry: std::time::Duration,
}

/// What a store request does (metrics).
#[derive(Clone, Copy)]
pub enum StoreOp {
    /// A block written.
    Put = 0,
    /// A block read.
    Get = 1,
    /// Blocks deleted (each counts).
    Delete = 2,
    /// A listing of blocks.
    List = 3,
}

const STORE_OPS: [&str; 4] = ["put", "get", "delete", "list"];

/// One kind of request's counters.
#[derive(Default)]
pub struct OpCounts {
    /// Requests (a delete or a list page counts once per call).
    pub count: AtomicU64,
    /// Of which failed.
    pub errors: AtomicU64,
    /// Bytes sent (put) or received (get).
    pub bytes: AtomicU64,
    /// Time spent, nanoseconds.
    pub ns: AtomicU64,
    /// Requests that took at most each of [`LATENCY_BOUNDS`] (not
    /// cumulative: the page adds them up).
    pub within: [AtomicU64; LATENCY_BOUNDS.len()],
}

/// Upper bounds of the store latency histogram, seconds: 1-2-5 steps
/// from 100 µs to 10 s (an object store answers in that range).
pub const LATENCY_BOUNDS: [f64; 16] = [
    1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// The traffic of a block store and its clones (metrics pages).
#[derive(Default)]
pub struct StoreStats {
    /// By [`StoreOp`].
    pub ops: [OpCounts; 4],
}

impl StoreStats {
    fn record(&self, op: StoreOp, t0: std::time::Instant, bytes: u64, ok: bool) {
        let c = &self.ops[op as usize];
        let took = t0.elapsed();
        c.count.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.ns.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        if let Some(i) = LATENCY_BOUNDS.iter().position(|&b| secs <= b) {
            c.within[i].fetch_add(1, Ordering::Relaxed);
        }
        if !ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Prometheus text: `solofs_store_requests_total`, `_errors_total`,
    /// `_bytes_total` and `_seconds_total`, and the histogram
    /// `solofs_store_request_seconds`, by operation.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        type Series = (&'static str, &'static str, fn(&OpCounts) -> f64);
        let series: [Series; 4] = [
            ("solofs_store_requests_total", "Object store requests, by operation.", |c| c.count.load(Ordering::Relaxed) as f64),
            ("solofs_store_errors_total", "Object store requests that failed (after retries), by operation.", |c| c.errors.load(Ordering::Relaxed) as f64),
            ("solofs_store_bytes_total", "Bytes sent to (put) and received from (get) the object store.", |c| c.bytes.load(Ordering::Relaxed) as f64),
            ("solofs_store_seconds_total", "Time spent in object store requests (divided by the requests: the mean latency), by operation.", |c| c.ns.load(Ordering::Relaxed) as f64 / 1e9),
        ];
        for (name, help, f) in series {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, op) in STORE_OPS.iter().enumerate() {
                let _ = writeln!(s, "{name}{{op=\"{op}\"}} {}", f(&self.ops[i]));
            }
        }
        let name = "solofs_store_request_seconds";
        let _ = writeln!(
            s,
            "# HELP {name} Object store request latency, by operation.\n# TYPE {name} histogram"
        );
        for (i, op) in STORE_OPS.iter().enumerate() {
            let c = &self.ops[i];
            let mut cum = 0;
            for (b, n) in LATENCY_BOUNDS.iter().zip(&c.within) {
                cum += n.load(Ordering::Relaxed);
                let _ = writeln!(s, "{name}_bucket{{op=\"{op}\",le=\"{b}\"}} {cum}");
            }
            let count = c.count.load(Ordering::Relaxed);
            let _ = writeln!(s, "{name}_bucket{{op=\"{op}\",le=\"+Inf\"}} {count}");
            let _ = writeln!(
                s,
                "{name}_sum{{op=\"{op}\"}} {}",
                c.ns.load(Ordering::Relaxed) as f64 / 1e9
            );
            let _ = writeln!(s, "{name}_count{{op=\"{op}\"}} {count}");
        }
        s
    }
}

/// How long a failed transfer is retried by default (as `solofs mount
/// --retry-secs`, for a restarting metadata server).
pub const DEFAULT_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// An error that may pass: the store could not be reached or answered
/// with a server error (object_store's own retries gave up).
fn transient(e: &object_store::Error) -> bool {
    // Refusals that no wait changes (S3 error codes in the message).
    const FINAL: [&str; 6] = [
        "NoSuchBucket",
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "403 Forbidden",
        "InvalidBucketName",
    ];
    matches!(
        e,
        object_store::Error::Generic { .. } | object_store::Error::JoinError { .. }
    ) && {
        let text = e.to_string();
        !FINAL.iter().any(|f| text.contains(f))
    }
}

/// Runs `f` until it succeeds, fails for good, or `span` has passed since
/// the first try, pausing between tries (100 ms, doubling up to 2 s).
async fn retrying<T, Fut>(
    span: std::time::Duration,
    mut f: impl FnMut() -> Fut,
) -> std::result::Result<T, object_store::Error>
where
    Fut: std::future::Future<Output = std::result::Result<T, object_store::Error>>,
{
    let deadline = std::time::Instant::now() + span;
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        match f().await {
            Err(e) if transient(&e) && std::time::Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            r => return r,
        }
    }
}

impl std::fmt::Debug for BlockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockStore({}, {})", self.url, self.volume)
    }
}

/// A put running in the background, or one already done.
pub struct PutTicket(Put);

enum Put {
    Running(JoinHandle<Result<()>>),
    Done(Result<()>),
}

impl PutTicket {
    /// Waits for the put to finish.
    pub fn wait(self) -> Result<()> {
        match self.0 {
            Put::Running(h) => runtime()
                .block_on(h)
                .map_err(|e| Error::Task(e.to_string()))?,
            Put::Done(r) => r,
        }
    }

    /// Has the put finished (successfully or not)?
    pub fn is_finished(&self) -> bool {
        match &self.0 {
            Put::Running(h) => h.is_finished(),
            Put::Done(_) => true,
        }
    }
}

/// Runs `fut` in the calling thread, outside the runtime: a local
/// directory's store then does its file I/O right here instead of handing
/// it to a blocking-pool thread and back (each hand-off a thread wake-up).
/// What still waits after a first poll is driven by the runtime.
fn here<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => runtime().block_on(fut),
    }
}

/// A get running in the background (read-ahead).
pub struct GetTicket(JoinHandle<Result<Option<Bytes>>>);

impl GetTicket {
    /// Waits for the block.
    pub fn wait(self) -> Result<Option<Bytes>> {
        runtime()
            .block_on(self.0)
            .map_err(|e| Error::Task(e.to_string()))?
    }
}

fn bad(url: &str, why: impl Into<String>) -> Error {
    Error::Url {
        url: url.to_string(),
        why: why.into(),
    }
}

/// Opens the object store a storage URL names.
/// A storage URL in words: the bucket and endpoint of an S3 URL, the
/// directory of a file:// one.
pub fn describe(url: &str) -> String {
    if let Some(dir) = url.strip_prefix("file://") {
        return format!("the block directory {dir}");
    }
    let Some(rest) = url.strip_prefix("s3://") else {
        return url.to_string();
    };
    let (loc, query) = rest.split_once('?').unwrap_or((rest, ""));
    let bucket = loc.split('/').next().unwrap_or("");
    let endpoint = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("endpoint="))
        .unwrap_or("AWS (no endpoint= given)");
    format!("S3 bucket {bucket:?} at {endpoint}")
}

fn open_store(url: &str, creds: Option<&S3Credentials>) -> Result<Arc<dyn ObjectStore>> {
    if let Some(dir) = url.strip_prefix("file://") {
        if !dir.starts_with('/') {
            return Err(bad(url, "a file:// URL needs an absolute path"));
        }
        std::fs::create_dir_all(dir).map_err(|e| bad(url, e.to_string()))?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)?
            .with_automatic_cleanup(true);
        return Ok(Arc::new(fs));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (loc, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = loc.split_once('/').unwrap_or((loc, ""));
        if bucket.is_empty() {
            return Err(bad(url, "no bucket"));
        }
        let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
        let (mut imds, mut anonymous) = (false, false);
        let plain_http = query.split('&').any(|kv| {
            kv.strip_prefix("endpoint=")
                .is_some_and(|v| v.starts_with("http://"))
        });
        if plain_http && !query.split('&').any(|kv| kv == "allow_http=true") {
            return Err(bad(
                url,
                "the endpoint is plain http://: add allow_http=true to the URL (or use an https:// endpoint)",
            ));
        }
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            b = match k {
                "endpoint" => b.with_endpoint(v),
                "region" => b.with_region(v),
                "allow_http" => b.with_allow_http(v == "true"),
                "imds" => {
                    imds = v == "true";
                    b
                }
                "skip_signature" => {
                    anonymous = v == "true";
                    b.with_skip_signature(anonymous)
                }
                _ => return Err(bad(url, format!("unknown parameter {k}"))),
            };
        }
        if let Some(c) = creds {
            b = b
                .with_access_key_id(&c.access_key_id)
                .with_secret_access_key(&c.secret_access_key);
        }
        // Without credentials the store would ask the cloud instance's
        // metadata service (169.254.169.254), slowly and in vain anywhere
        // else: only when the URL says so.
        let from_env = [
            "AWS_ACCESS_KEY_ID",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()));
        if creds.is_none() && !from_env && !imds && !anonymous {
            return Err(bad(
                url,
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                 (or add imds=true to the URL to use the cloud instance's role, \
                 skip_signature=true for a public bucket)",
            ));
        }
        // A wrong endpoint fails in seconds, not after minutes of retries.
        b = b.with_retry(object_store::RetryConfig {
            max_retries: 4,
            retry_timeout: std::time::Duration::from_secs(20),
            ..Default::default()
        });
        let s3: Arc<dyn ObjectStore> = Arc::new(b.build()?);
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            return Ok(s3);
        }
        return Ok(Arc::new(object_store::prefix::PrefixStore::new(
            s3,
            ObjPath::from(prefix),
        )));
    }
    Err(bad(url, "only file:// and s3:// are supported"))
}

impl BlockStore {
    /// Opens the blocks of volume `volume` (its id in hex) under `url`.
    pub fn open(
        url: &str,
        volume: &str,
        block_size: u64,
        creds: Option<&S3Credentials>,
    ) -> Result<BlockStore> {
        if !block_size.is_power_of_two() || block_size < 4096 {
            return Err(bad(url, format!("block size {block_size}")));
        }
        let _rt = runtime().enter();
        Ok(BlockStore {
            store: open_store(url, creds)?,
            stats: Default::default(),
            volume: volume.to_string(),
            block_size,
            url: url.to_string(),
            local: url.starts_with("file://"),
            root: url.strip_prefix("file://").map(std::path::PathBuf::from),
            retry: if url.starts_with("file://") {
                std::time::Duration::ZERO
            } else {
                DEFAULT_RETRY
            },
        })
    }

    /// Sets how long a failed put or get of a remote store is tried again
    /// (default [`DEFAULT_RETRY`]; `file://` stores are not retried).
    pub fn with_retry(mut self, span: std::time::Duration) -> BlockStore {
        if !self.local {
            self.retry = span;
        }
        self
    }

    /// Its traffic so far (all clones together).
    pub fn stats(&self) -> &Arc<StoreStats> {
        &self.stats
    }

    /// The block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The storage URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn key(&self, ino: u64, block: u64) -> ObjPath {
        ObjPath::from(format!("{}/{ino}/{block}", self.volume))
    }

    fn ino_prefix(&self, ino: u64) -> ObjPath {
        ObjPath::from(format!("{}/{ino}", self.volume))
    }

    /// Checks that the store works for this volume: puts, reads back and
    /// deletes a small probe object. The error names the store (bucket,
    /// endpoint) and says what failed.
    pub fn probe(&self) -> Result<()> {
        let key = ObjPath::from(format!(
            "{}/probe-{}-{}",
            self.volume,
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let store = self.store.clone();
        let what = |step: &str, e: String| {
            bad(
                &self.url,
                format!(
                    "{}: {step} of a probe object failed: {e}",
                    describe(&self.url)
                ),
            )
        };
        let body = Bytes::from_static(b"solofs probe");
        let r = runtime().block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(30), async {
                // A listing first: some stores (s3s-fs) make a missing
                // bucket on a put instead of refusing it.
                let prefix = ObjPath::from(self.volume.as_str());
                if let Some(Err(e)) = store.list(Some(&prefix)).next().await {
                    return Err(("list", e.to_string()));
                }
                store
                    .put(&key, PutPayload::from(body.clone()))
                    .await
                    .map_err(|e| ("put", e.to_string()))?;
                let got = store
                    .get(&key)
                    .await
                    .map_err(|e| ("get", e.to_string()))?
                    .bytes()
                    .await
                    .map_err(|e| ("get", e.to_string()))?;
                if got != body {
                    return Err(("get", "it read back different bytes".to_string()));
                }
                store
                    .delete(&key)
                    .await
                    .map_err(|e| ("delete", e.to_string()))
            })
            .await
        });
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err((step, e))) if e.contains("NoSuchBucket") => Err(what(
                step,
                format!("{e} (the bucket does not exist: create it first, e.g. `aws s3 mb s3://BUCKET --endpoint-url ENDPOINT`)"),
            )),
            Ok(Err((step, e))) => Err(what(step, e)),
            Err(_) => Err(what("put", "no answer within 30 s".into())),
        }
    }

    /// Writes block `block` of `ino` (at most one block of bytes).
    pub fn put(&self, ino: u64, block: u64, data: Bytes) -> Result<()> {
        // Driven by the calling thread: no hop to a runtime worker and back.
        let (t0, len) = (std::time::Instant::now(), data.len() as u64);
        let key = self.key(ino, block);
        let r = if self.local {
            here(self.store.put(&key, PutPayload::from(data))).map(|_| ())
        } else {
            let payload = PutPayload::from(data);
            runtime()
                .block_on(retrying(self.retry, || {
                    self.store.put(&key, payload.clone())
                }))
                .map(|_| ())
        };
        self.stats.record(StoreOp::Put, t0, len, r.is_ok());
        Ok(r?)
    }

    /// Can [`BlockStore::patch`] write into blocks where they are (a
    /// `file://` store)?
    pub fn patches(&self) -> bool {
        self.root.is_some()
    }

    /// The same store, writing whole blocks only (as a remote store
    /// does): for tests of that path on a `file://` store.
    pub fn without_patches(mut self) -> BlockStore {
        self.root = None;
        self
    }

    /// Writes `ranges` (offset in the block, bytes) into block `block` of
    /// `ino` where it is, leaving its other bytes as they are (bytes past
    /// its end up to a range read as zeros): a small write into a large
    /// block costs its own size, not the block's. Only for a `file://`
    /// store ([`BlockStore::patches`]); the caller waits for any put of
    /// the block first.
    pub fn patch(&self, ino: u64, block: u64, ranges: &[(u64, &[u8])]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let Some(root) = &self.root else {
            return Err(Error::Read("patch of a block of a remote store".into()));
        };
        let t0 = std::time::Instant::now();
        let len: u64 = ranges.iter().map(|(_, d)| d.len() as u64).sum();
        let dir = root.join(&self.volume).join(ino.to_string());
        let path = dir.join(block.to_string());
        let r = (|| -> std::io::Result<()> {
            let open = || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
            };
            let f = match open() {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir_all(&dir)?;
                    open()?
                }
                r => r?,
            };
            for &(at, data) in ranges {
                debug_assert!(at + data.len() as u64 <= self.block_size);
                f.write_all_at(data, at)?;
            }
            Ok(())
        })();
        self.stats.record(StoreOp::Put, t0, len, r.is_ok());
        r.map_err(|e| {
            Error::Store(object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            })
        })
    }

    /// Starts writing a block in the background. A block shorter than the
    /// block size (a small file, a file's tail) of a local store is
    /// written at once by the calling thread: it is a copy into the page
    /// cache, cheaper than the two thread hand-offs a background put costs.
    pub fn put_async(&self, ino: u64, block: u64, data: Bytes) -> PutTicket {
        debug_assert!(data.len() as u64 <= self.block_size);
        if self.local && (data.len() as u64) < self.block_size {
            return PutTicket(Put::Done(self.put(ino, block, data)));
        }
        let (store, stats) = (self.store.clone(), self.stats.clone());
        let key = self.key(ino, block);
        let span = self.retry;
        PutTicket(Put::Running(runtime().spawn(async move {
            let (t0, len) = (std::time::Instant::now(), data.len() as u64);
            let payload = PutPayload::from(data);
            let r = retrying(span, || store.put(&key, payload.clone())).await;
            stats.record(StoreOp::Put, t0, len, r.is_ok());
            r?;
            Ok(())
        })))
    }

    /// Reads a whole block; `None` if it does not exist (a hole).
    pub fn get(&self, ino: u64, block: u64) -> Result<Option<Bytes>> {
        let t0 = std::time::Instant::now();
        let r = self.get_now(ino, block);
        let got = r
            .as_ref()
            .map_or(0, |b| b.as_ref().map_or(0, |b| b.len() as u64));
        self.stats.record(StoreOp::Get, t0, got, r.is_ok());
        r
    }

    fn get_now(&self, ino: u64, block: u64) -> Result<Option<Bytes>> {
        let key = self.key(ino, block);
        let get = async {
            let r = match retrying(self.retry, || self.store.get(&key)).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let GetResult {
                payload,
                meta,
                range,
                attributes,
                extensions,
            } = r;
            match payload {
                // A local file: read it here, in the caller's thread (not a
                // runtime worker), instead of chunk by chunk on the
                // runtime's blocking threads.
                GetResultPayload::File(f, _) => {
                    use std::io::{Read, Seek, SeekFrom};
                    let len = range.end - range.start;
                    let mut buf = Vec::with_capacity(len as usize);
                    let io = |e: std::io::Error| Error::Read(format!("reading {key}: {e}"));
                    let mut f = f;
                    f.seek(SeekFrom::Start(range.start)).map_err(io)?;
                    f.take(len).read_to_end(&mut buf).map_err(io)?;
                    Ok(Some(Bytes::from(buf)))
                }
                payload => Ok(Some(
                    GetResult {
                        payload,
                        meta,
                        range,
                        attributes,
                        extensions,
                    }
                    .bytes()
                    .await?,
                )),
            }
        };
        if self.local {
            here(get)
        } else {
            runtime().block_on(get)
        }
    }

    /// Starts reading a block in the background.
    pub fn get_async(&self, ino: u64, block: u64) -> GetTicket {
        let (store, stats) = (self.store.clone(), self.stats.clone());
        let key = self.key(ino, block);
        let span = self.retry;
        GetTicket(runtime().spawn(async move {
            let t0 = std::time::Instant::now();
            let got = retrying(span, || async {
                let r = store.get(&key).await?;
                r.bytes().await
            });
            let r = match got.await {
                Ok(b) => Ok(Some(b)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            };
            let n = r.as_ref().map_or(0, |b: &Option<Bytes>| {
                b.as_ref().map_or(0, |b| b.len() as u64)
            });
            stats.record(StoreOp::Get, t0, n, r.is_ok());
            r
        }))
    }

    /// Block numbers stored for `ino`, sorted.
    pub fn blocks(&self, ino: u64) -> Result<Vec<u64>> {
        let t0 = std::time::Instant::now();
        let store = self.store.clone();
        let prefix = self.ino_prefix(ino);
        let r = runtime().block_on(async move {
            let mut out = Vec::new();
            let mut s = store.list(Some(&prefix));
            while let Some(m) = s.next().await {
                let m = m?;
                if let Some(b) = m.location.filename().and_then(|f| f.parse().ok()) {
                    out.push(b);
                }
            }
            out.sort_unstable();
            Ok(out)
        });
        self.stats.record(StoreOp::List, t0, 0, r.is_ok());
        r
    }

    /// Deletes every stored block of `ino` numbered `first` or above;
    /// returns how many went. Missing blocks are not an error.
    pub fn delete_from(&self, ino: u64, first: u64) -> Result<u64> {
        self.delete_range(ino, first, u64::MAX)
    }

    /// Deletes every stored block of `ino` numbered from `first` up to
    /// (not including) `end`; returns how many went (a punched hole).
    pub fn delete_range(&self, ino: u64, first: u64, end: u64) -> Result<u64> {
        let t0 = std::time::Instant::now();
        let doomed: Vec<u64> = self
            .blocks(ino)?
            .into_iter()
            .filter(|&b| b >= first && b < end)
            .collect();
        let store = self.store.clone();
        let keys: Vec<ObjPath> = doomed.iter().map(|&b| self.key(ino, b)).collect();
        let r = runtime().block_on(async move {
            let mut n = 0;
            let mut s = futures_util::stream::iter(keys)
                .map(|k| {
                    let store = store.clone();
                    async move {
                        match store.delete(&k).await {
                            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                            Err(e) => Err(e),
                        }
                    }
                })
                .buffer_unordered(16);
            while let Some(r) = s.next().await {
                r?;
                n += 1;
            }
            Ok(n)
        });
        if !doomed.is_empty() {
            self.stats.record(StoreOp::Delete, t0, 0, r.is_ok());
            let n = r.as_ref().map_or(0u64, |n| *n).saturating_sub(1);
            self.stats.ops[StoreOp::Delete as usize]
                .count
                .fetch_add(n, Ordering::Relaxed);
        }
        r
    }

    /// Copies blocks `(ino, block)` of volume `src` (in the same store)
    /// to this volume's names: the store's own copy (a hard link for a
    /// local directory, a server-side copy on S3), 16 at a time. Returns
    /// how many were copied; a block `src` does not have is an error.
    pub fn copy_from(&self, src: &BlockStore, blocks: &[(u64, u64)]) -> Result<u64> {
        let store = self.store.clone();
        let pairs: Vec<(ObjPath, ObjPath)> = blocks
            .iter()
            .map(|&(i, b)| (src.key(i, b), self.key(i, b)))
            .collect();
        runtime().block_on(async move {
            let mut n = 0;
            let mut s = futures_util::stream::iter(pairs)
                .map(|(from, to)| {
                    let store = store.clone();
                    async move { store.copy(&from, &to).await }
                })
                .buffer_unordered(16);
            while let Some(r) = s.next().await {
                r?;
                n += 1;
            }
            Ok(n)
        })
    }

    /// Every ino that has blocks in this volume, with its block numbers
    /// (fsck).
    pub fn all_blocks(&self) -> Result<Vec<(u64, Vec<u64>)>> {
        let t0 = std::time::Instant::now();
        let store = self.store.clone();
        let prefix = ObjPath::from(self.volume.as_str());
        let r = runtime().block_on(async move {
            let mut map = std::collections::BTreeMap::<u64, Vec<u64>>::new();
            let mut s = store.list(Some(&prefix));
            while let Some(m) = s.next().await {
                let m = m?;
                let parts: Vec<_> = m.location.parts().collect();
                let n = parts.len();
                if n < 2 {
                    continue;
                }
                let ino = parts[n - 2].as_ref().parse::<u64>();
                let b = parts[n - 1].as_ref().parse::<u64>();
                if let (Ok(i), Ok(b)) = (ino, b) {
                    map.entry(i).or_default().push(b);
                }
            }
            Ok(map
                .into_iter()
                .map(|(i, mut v)| {
                    v.sort_unstable();
                    (i, v)
                })
                .collect())
        });
        self.stats.record(StoreOp::List, t0, 0, r.is_ok());
        r
    }
}

/// Objects kept beside a volume's blocks, under `<volume id>.archive/`
/// (the archive of its journal and images, docs/archive.md): never under
/// the volume's own prefix, which holds blocks only.
#[derive(Clone)]
pub struct Archive {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    retry: std::time::Duration,
}

impl BlockStore {
    /// The volume's archive area in the same store.
    pub fn archive(&self) -> Archive {
        Archive {
            store: self.store.clone(),
            prefix: format!("{}.archive", self.volume),
            retry: self.retry,
        }
    }

    /// The volume ids that have an archive in this store (for `solofs
    /// restore` without `--volume`).
    pub fn archived_volumes(&self) -> Result<Vec<String>> {
        let store = self.store.clone();
        runtime().block_on(async move {
            let l = store.list_with_delimiter(None).await?;
            Ok(l.common_prefixes
                .iter()
                .filter_map(|p| p.filename()?.strip_suffix(".archive").map(str::to_string))
                .collect())
        })
    }
}

impl Archive {
    fn path(&self, name: &str) -> ObjPath {
        ObjPath::from(format!("{}/{name}", self.prefix))
    }

    /// Writes object `name`.
    pub fn put(&self, name: &str, data: Bytes) -> Result<()> {
        let (key, payload) = (self.path(name), PutPayload::from(data));
        runtime().block_on(retrying(self.retry, || {
            self.store.put(&key, payload.clone())
        }))?;
        Ok(())
    }

    /// Reads object `name`; `None` if there is none.
    pub fn get(&self, name: &str) -> Result<Option<Bytes>> {
        let key = self.path(name);
        runtime().block_on(async {
            match retrying(self.retry, || self.store.get(&key)).await {
                Ok(r) => Ok(Some(r.bytes().await?)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Every object under `dir` (a name relative to the archive, e.g.
    /// `journal`): its name relative to the archive and its size, sorted
    /// by name.
    pub fn list(&self, dir: &str) -> Result<Vec<(String, u64)>> {
        let prefix = self.path(dir);
        let strip = format!("{}/", self.prefix);
        let store = self.store.clone();
        runtime().block_on(async move {
            let mut out = Vec::new();
            let mut s = store.list(Some(&prefix));
            while let Some(m) = s.next().await {
                let m = m?;
                let name = m.location.as_ref();
                if let Some(rel) = name.find(&strip).map(|i| &name[i + strip.len()..]) {
                    out.push((rel.to_string(), m.size));
                }
            }
            out.sort();
            Ok(out)
        })
    }

    /// Deletes object `name` (absent: not an error).
    pub fn delete(&self, name: &str) -> Result<()> {
        let key = self.path(name);
        runtime().block_on(async {
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
    }
}

/// The volume id as the hex string that prefixes its block keys.
pub fn volume_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// No runtime for the object store: nothing of the data path can work.
#[allow(clippy::panic, reason = "a process without threads cannot serve data")]
fn fatal(e: std::io::Error) -> tokio::runtime::Runtime {
    panic!("cannot start the data runtime: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_short_blocks_are_written_by_the_caller() {
        let dir = std::env::temp_dir().join(format!("solofs-data-{}", std::process::id()));
        let url = format!("file://{}", dir.display());
        let s = BlockStore::open(&url, "v", 4096, None).unwrap();
        // A short block: written before put_async returns, in this thread.
        let t = s.put_async(7, 0, Bytes::from_static(b"tail"));
        assert!(t.is_finished());
        t.wait().unwrap();
        assert!(dir.join("v/7/0").exists());
        assert_eq!(s.get(7, 0).unwrap().as_deref(), Some(&b"tail"[..]));
        // A whole block goes through the runtime, and lands as well.
        let full = Bytes::from(vec![5u8; 4096]);
        s.put_async(7, 1, full.clone()).wait().unwrap();
        assert_eq!(s.get(7, 1).unwrap(), Some(full));
        assert_eq!(s.get(7, 2).unwrap(), None);
        assert_eq!(s.blocks(7).unwrap(), vec![0, 1]);
        assert_eq!(s.delete_from(7, 0).unwrap(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
