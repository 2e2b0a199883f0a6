//! Where an export lives: a directory, or S3-compatible object storage
//! (`s3://BUCKET/PREFIX`, through the `object_store` crate).
//!
//! An export is a set of keys (`chunks/ab/abcd…`, `namespace/<sha256>.rmj`,
//! `manifest.json`); each put is whole or nothing (a directory: a temporary name, synced,
//! then renamed; S3: one PUT, which an interrupted upload never completes), and the manifest
//! goes last, so an interrupted export never passes for a complete one.
//!
//! S3 is configured as the AWS tools are, from the environment: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` (default `us-east-1`), and `AWS_ENDPOINT_URL` for
//! a store other than AWS's. Plain http is allowed only when that endpoint names it
//! (`http://…`: a test server on loopback, or a store inside a trusted network).

use object_store::ObjectStore;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The keys of an export, in a directory or a bucket.
pub trait ExportStore: Send + Sync {
    /// The bytes under `key`; None if there is no such key.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String>;
    /// Stores `bytes` under `key`, whole or not at all.
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), String>;
    fn exists(&self, key: &str) -> Result<bool, String>;
    /// Makes what was put durable (a directory: its entries synced).
    fn finish(&self) -> Result<(), String> {
        Ok(())
    }
    /// Where, for messages.
    fn describe(&self) -> String;
}

/// Opens `dest`: `s3://BUCKET[/PREFIX]`, else a directory (made if missing, for a put).
pub fn open(dest: &str) -> Result<Box<dyn ExportStore>, String> {
    match dest.strip_prefix("s3://") {
        Some(rest) => Ok(Box::new(ObjectExport::s3(rest)?)),
        None => Ok(Box::new(DirStore(PathBuf::from(dest)))),
    }
}

/// An export in a local directory.
pub struct DirStore(pub PathBuf);

fn io_err(what: &str, p: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", p.display())
}

impl ExportStore for DirStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let p = self.0.join(key);
        match std::fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("cannot read", &p, e)),
        }
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), String> {
        let path = self.0.join(key);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create", dir, e))?;
        }
        // Its own name: two threads may put the same chunk (equal contents) at once.
        static PUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("part{}-{n}", std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_err("cannot create", &tmp, e))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| io_err("cannot write", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io_err("cannot rename", &tmp, e))
    }

    fn exists(&self, key: &str) -> Result<bool, String> {
        Ok(self.0.join(key).exists())
    }

    fn finish(&self) -> Result<(), String> {
        // The directory entries themselves (the manifest's rename above all) made durable.
        if let Ok(d) = std::fs::File::open(&self.0) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn describe(&self) -> String {
        self.0.display().to_string()
    }
}

/// An export in object storage (an S3-compatible bucket), under a prefix.
pub struct ObjectExport {
    store: std::sync::Arc<dyn object_store::ObjectStore>,
    /// `s3://BUCKET`, for messages.
    url: String,
    prefix: String,
    /// The store's client is asynchronous; each call here waits on this runtime.
    runtime: tokio::runtime::Runtime,
}

impl ObjectExport {
    /// `rest` is `BUCKET[/PREFIX]` (of `s3://BUCKET/PREFIX`).
    pub fn s3(rest: &str) -> Result<ObjectExport, String> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err("s3://BUCKET[/PREFIX]: the bucket is missing".into());
        }
        let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
        if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
            builder = builder.with_region("us-east-1");
        }
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .ok();
        if let Some(e) = &endpoint {
            builder = builder.with_endpoint(e);
            if e.starts_with("http://") {
                builder = builder.with_allow_http(true);
            }
        }
        let store = builder.build().map_err(|e| format!("s3://{rest}: {e}"))?;
        ObjectExport::over(
            std::sync::Arc::new(store),
            &format!("s3://{bucket}"),
            prefix,
        )
    }

    /// Over any object store (tests use `object_store::memory::InMemory`); `url` names it.
    pub fn over(
        store: std::sync::Arc<dyn object_store::ObjectStore>,
        url: &str,
        prefix: &str,
    ) -> Result<ObjectExport, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the object store client's runtime: {e}"))?;
        Ok(ObjectExport {
            store,
            url: url.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            runtime,
        })
    }

    fn path(&self, key: &str) -> object_store::path::Path {
        if self.prefix.is_empty() {
            object_store::path::Path::from(key)
        } else {
            object_store::path::Path::from(format!("{}/{key}", self.prefix))
        }
    }

    fn err(&self, what: &str, key: &str, e: object_store::Error) -> String {
        format!("{what} {}/{}: {e}", self.url, self.path(key))
    }
}

impl ExportStore for ObjectExport {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let path = self.path(key);
        let got = self.runtime.block_on(async {
            match self.store.get(&path).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        got.map(|b| b.map(|b| b.to_vec()))
            .map_err(|e| self.err("cannot read", key, e))
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), String> {
        let path = self.path(key);
        let payload = object_store::PutPayload::from(bytes.to_vec());
        self.runtime
            .block_on(self.store.put(&path, payload))
            .map(|_| ())
            .map_err(|e| self.err("cannot write", key, e))
    }

    fn exists(&self, key: &str) -> Result<bool, String> {
        let path = self.path(key);
        match self.runtime.block_on(self.store.head(&path)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err("cannot look up", key, e)),
        }
    }

    fn describe(&self) -> String {
        if self.prefix.is_empty() {
            self.url.clone()
        } else {
            format!("{}/{}", self.url, self.prefix)
        }
    }
}
