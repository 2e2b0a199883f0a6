//! Model-checked (shuttle): the journal's committer has every write answered so far settled
//! ([`DataStore::send_all_behind`]) while a writer of one of those files, holding its lock,
//! waits for that commit (an allocation on a full pool waits for the frees a commit
//! releases), and the worker sends too. With the committer waiting for the file's lock
//! instead (as it did), some interleaving deadlocks: the writer took the lock, sending the
//! write, after the committer saw it unsent. (In the product the writer's wait is bounded,
//! `FULL_POOL_FREES_WAIT`: that race stalled every commit half a second and answered the
//! writer ENOSPC though the room it waited for was about to come back.)

use super::*;
use crate::sync::thread;

/// What [`DataStore::flush_waiting`] does to the state (the send itself left out).
fn flush(wb: &WriteBehind, file: &FileData) {
    if let Some(sending) = wb.take_waiting(file) {
        sending.settle(Ok(()));
    }
}

/// A write answered before it was sent (the caller holds the file's lock).
fn write(wb: &WriteBehind, file: &Arc<FileData>) {
    let slot = wb.free.lock().pop().expect("a free slot");
    wb.put_waiting(file, 0, slot, 1);
}

/// A store writing behind and a file with one write waiting to be sent (its number).
fn one_written() -> (Arc<WriteBehind>, Arc<FileData>, u64) {
    let wb = Arc::new(WriteBehind::new().unwrap());
    let file = Arc::new(FileData::default());
    let lock = file.chunks.write();
    write(&wb, &file);
    let number = wb.peek_waiting(&file).expect("it waits").number;
    drop(lock);
    (wb, file, number)
}

/// The write-behind worker's round on `file`: it takes the lock and sends the waiting write.
fn worker(wb: &Arc<WriteBehind>, file: &Arc<FileData>) -> thread::JoinHandle<()> {
    let (wb, file) = (wb.clone(), file.clone());
    thread::spawn(move || {
        let _lock = file.chunks.write();
        flush(&wb, &file);
    })
}

#[test]
fn model_a_commit_settles_written_behind_bytes_without_waiting_for_their_files() {
    shuttle::check_random(
        || {
            let (wb, file, _) = one_written();
            let committed = Arc::new((Mutex::new(false), Condvar::new()));
            let writer = {
                let (wb, file, committed) = (wb.clone(), file.clone(), committed.clone());
                thread::spawn(move || {
                    let _lock = file.chunks.write();
                    // `DataStore::lock` sends the waiting write.
                    flush(&wb, &file);
                    // An allocation on a full pool: it waits for the commit's frees.
                    let (done, told) = &*committed;
                    let mut done = done.lock();
                    while !*done {
                        done = told.wait(done);
                    }
                })
            };
            let worker = worker(&wb, &file);
            // The committer.
            let answered = wb.answered();
            wb.settle_all(&answered, |f, _| flush(&wb, f));
            for (f, n) in &answered {
                assert!(wb.settled(f, *n), "write {n} committed before it was sent");
            }
            *committed.0.lock() = true;
            committed.1.notify_all();
            writer.join().unwrap();
            worker.join().unwrap();
        },
        2000,
    );
}

/// Model-checked (shuttle): a shared volume's client appends a write held back
/// (`volume::shared::behind`), holding what is held back, and sends that write's bytes first
/// by its number ([`DataStore::send_later`]), while the file's writer, holding the file's
/// lock, has answered the next write before it was sent and waits to hold it back too. Sending
/// every write answered so far instead (as the holder's journal does) deadlocks: the next
/// write waits under a lock whose holder waits for the append.
#[test]
fn model_a_held_write_is_sent_by_its_number_while_its_file_is_written_again() {
    shuttle::check_random(
        || {
            let (wb, file, held) = one_written();
            // What the client holds back (the writes' changes), under one lock.
            let behind = Arc::new(Mutex::new(vec![held]));
            let writer = {
                let (wb, file, behind) = (wb.clone(), file.clone(), behind.clone());
                thread::spawn(move || {
                    let _lock = file.chunks.write();
                    // `DataStore::lock` sends the waiting write.
                    flush(&wb, &file);
                    write(&wb, &file);
                    let next = wb.peek_waiting(&file).expect("it waits").number;
                    // Held back: it waits for the append under way.
                    behind.lock().push(next);
                })
            };
            let worker = worker(&wb, &file);
            // The append of what is held back.
            {
                let held = behind.lock();
                for &n in held.iter() {
                    wb.send_through(&file, n, |_| flush(&wb, &file));
                }
                for &n in held.iter() {
                    assert!(
                        wb.settled(&file, n),
                        "write {n} appended before it was sent"
                    );
                }
            }
            writer.join().unwrap();
            worker.join().unwrap();
        },
        2000,
    );
}
