//! Model-checked (shuttle): this client's record of the turns it holds ([`HeldTurns`])
//! against the engine's, with the real [`State::turn_in_use`] and the lingering thread's real
//! give-backs ([`give_due`]) on the in-memory engine (each engine call one atomic step), while
//! another client asks for the turn this client is taking. The promise: a change runs only
//! under a turn the engine holds for its client, so two clients never change one inode at
//! once. The race it guards: the take's answer is on its way when the lingering thread hears
//! the turn asked for; not recorded yet, the turn is given back as unrecorded and the other
//! client takes it; the answer, recorded after that, must not count as held. With the
//! check of [`HeldTurns::given_since`] left out of `turn_in_use`, this test fails (both
//! clients change the inode at once: checked). The same race on the claims path: a change
//! that makes an inode claims its turn in its append ([`State::offer_changes`]), and the
//! other client asks for it once the append is in the log; the claim, recorded by
//! [`State::appended`] after the lingering thread gave the turn back unrecorded, must not
//! count as held either (with `given_since` left out there, it fails: checked).

use super::linger::give_due;
use super::*;
use crate::engine::mem::MemEngine;
use crate::sync::thread;
use crate::volume::shared::append::Outgoing;

/// The inode both clients change.
const INO: Ino = 42;

/// Longer than any model run: no turn runs out by itself.
const LONG: Duration = Duration::from_secs(3600);

/// A client's state on `engine` (its session started), as [`join`] makes it.
fn client(engine: &Arc<MemEngine>, who: &str) -> Arc<State> {
    engine.start_session(who, LONG).unwrap();
    let (notify, _) = crossbeam_channel::unbounded();
    Arc::new(State::new(
        engine.clone(),
        who.into(),
        FsConfig::default(),
        0,
        Arc::new(FreeGate::waiting_for_the_floor()),
        notify,
    ))
}

/// Who changes the inode now, as each client believes: never two at once.
#[derive(Default)]
struct Changing(Mutex<Option<&'static str>>);

impl Changing {
    /// `who` changes the inode for a while (other threads may run meanwhile).
    fn change(&self, who: &'static str) {
        {
            let mut now = self.0.lock();
            if let Some(other) = *now {
                panic!("{who} and {other} change inode {INO} at once: both hold its turn");
            }
            *now = Some(who);
        }
        thread::yield_now();
        *self.0.lock() = None;
    }
}

/// How client a comes to hold the turn before its change.
#[derive(Clone, Copy)]
enum Getting {
    /// Taken from the engine ([`State::turn_in_use`]).
    Taken,
    /// Claimed by the append of a change that makes the inode, then used.
    Claimed,
}

/// Client a gets inode [`INO`]'s turn (`how`) and changes the inode, its lingering thread
/// giving back what it hears asked for, while client b asks for the turn until it has it
/// (once the inode is in the log: before that, nobody knows it) and changes it too.
fn two_clients_one_inode(how: Getting) {
    let engine = Arc::new(MemEngine::new());
    let a = client(&engine, "a");
    engine.start_session("b", LONG).unwrap();
    let changing = Arc::new(Changing::default());
    let changed = Arc::new(AtomicBool::new(false));
    // Client a's change: its turn (claimed, taken from the engine, or held), then the change.
    let change = {
        let (a, engine) = (a.clone(), engine.clone());
        let (changing, changed) = (changing.clone(), changed.clone());
        thread::spawn(move || {
            if let Getting::Claimed = how {
                // Nobody else knows the inode before this append: it is taken.
                let made = a.offer_changes(Outgoing {
                    claim: &[INO],
                    ..Outgoing::default()
                });
                assert!(
                    made.is_ok(),
                    "the append that makes inode {INO} was refused"
                );
            }
            let (turn, _) = a.turn_in_use(INO).unwrap();
            let holder = engine.turn_holder(INO);
            assert!(
                holder.as_deref() == Some("a"),
                "a changes inode {INO} under a turn the engine holds for {holder:?}"
            );
            changing.change("a");
            drop(turn);
            changed.store(true, Ordering::SeqCst);
        })
    };
    // Client a's lingering thread: its rounds, what it hears asked for given back, until
    // the change has ended (the model does not wait to hear: shuttle's timed waits never
    // time out).
    let lingerer = {
        let (a, engine, changed) = (a.clone(), engine.clone(), changed.clone());
        thread::spawn(move || {
            while !changed.load(Ordering::SeqCst) {
                give_due(&a, engine.wanted("a", Duration::ZERO).unwrap());
                thread::yield_now();
            }
        })
    };
    // Client b: asks for the turn (the engine tells a) until it has it.
    let other = {
        let (engine, changing) = (engine.clone(), changing.clone());
        thread::spawn(move || {
            if let Getting::Claimed = how {
                while engine.read_after(0, 1).unwrap().is_empty() {
                    thread::yield_now();
                }
            }
            loop {
                match engine.take_turn("b", INO, LONG, Duration::ZERO) {
                    Ok(_) => break,
                    Err(EngineError::TurnBusy { .. }) => thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
            changing.change("b");
            engine.give_turns("b", &[INO]).unwrap();
        })
    };
    change.join().unwrap();
    lingerer.join().unwrap();
    // What a still holds goes back as it leaves; b then has its turn.
    a.give_all();
    other.join().unwrap();
    assert!(
        !a.holds(INO),
        "a still records the turn after giving everything back"
    );
}

#[test]
fn model_a_turn_given_back_while_its_take_is_answered_is_not_held() {
    shuttle::check_random(|| two_clients_one_inode(Getting::Taken), 3000);
}

#[test]
fn model_a_turn_given_back_while_its_claim_is_answered_is_not_held() {
    shuttle::check_random(|| two_clients_one_inode(Getting::Claimed), 3000);
}
