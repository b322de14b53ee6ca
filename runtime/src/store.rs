//! Local RocksDB stores that hold only what can be rebuilt (a worker's checkpoints from the
//! handoff snapshots and the input, a reducer's lists from the summaries topic): one that
//! cannot be read is set aside for inspection and replaced by an empty one, instead of
//! failing every start of the pod.

use std::path::{Path, PathBuf};

use rocksdb::{DB, ErrorKind, Options};

use crate::Error;

/// A store opened by [`open_rebuildable`].
pub struct Opened {
    pub db: DB,
    /// Where the unreadable store that was there went, if one was set aside.
    pub set_aside: Option<PathBuf>,
}

/// Where a store at `path` is set aside: one place, so that a disk that keeps corrupting
/// stores does not fill up with them.
pub fn aside_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".corrupt");
    path.with_file_name(name)
}

/// Opens (creating if missing) the store at `path`; when RocksDB reports it corrupt, moves it
/// to [`aside_path`] (replacing an older one there) and opens an empty store in its place.
/// Other errors, such as a lock held by another process, are returned as they are.
pub fn open_rebuildable(path: &Path, options: &Options) -> Result<Opened, Error> {
    match DB::open(options, path) {
        Ok(db) => Ok(Opened {
            db,
            set_aside: None,
        }),
        Err(err) if err.kind() == ErrorKind::Corruption => {
            tracing::error!(path = %path.display(), %err, "local store corrupt; setting it aside and rebuilding");
            set_aside(path)
                .and_then(|aside| {
                    DB::open(options, path)
                        .map(|db| (db, aside))
                        .map_err(store_error(path))
                })
                .map(|(db, aside)| Opened {
                    db,
                    set_aside: Some(aside),
                })
        }
        Err(err) => Err(store_error(path)(err)),
    }
}

/// Moves the store at `path` to [`aside_path`]; returns where it went.
pub fn set_aside(path: &Path) -> Result<PathBuf, Error> {
    let aside = aside_path(path);
    let io = |e: std::io::Error| Error::Store {
        path: path.display().to_string(),
        reason: format!("cannot set it aside to {}: {e}", aside.display()),
    };
    if aside.exists() {
        std::fs::remove_dir_all(&aside).map_err(io)?;
    }
    std::fs::rename(path, &aside).map_err(io)?;
    Ok(aside)
}

fn store_error(path: &Path) -> impl Fn(rocksdb::Error) -> Error + '_ {
    move |err| Error::Store {
        path: path.display().to_string(),
        reason: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        let mut options = Options::default();
        options.create_if_missing(true);
        options
    }

    #[test]
    fn a_corrupt_store_is_set_aside_and_an_empty_one_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let opened = open_rebuildable(&path, &options()).unwrap();
        assert!(opened.set_aside.is_none());
        opened.db.put(b"k", b"v").unwrap();
        drop(opened);
        // Twice: the second time replaces the first one set aside.
        for _ in 0..2 {
            std::fs::write(path.join("CURRENT"), b"garbage").unwrap();
            let opened = open_rebuildable(&path, &options()).unwrap();
            assert_eq!(
                opened.set_aside.as_deref(),
                Some(aside_path(&path).as_path())
            );
            assert_eq!(opened.db.get(b"k").unwrap(), None);
            assert!(aside_path(&path).join("CURRENT").exists());
            opened.db.put(b"k", b"v").unwrap();
        }
    }

    #[test]
    fn a_store_in_use_is_not_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let _held = open_rebuildable(&path, &options()).unwrap();
        assert!(open_rebuildable(&path, &options()).is_err());
        assert!(!aside_path(&path).exists());
    }
}
