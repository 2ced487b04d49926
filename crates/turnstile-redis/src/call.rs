//! [`Call`]: one call's keys and arguments, sent as `FCALL` or `EVALSHA`.

use std::cell::Cell;

use redis::{Arg, Cmd, ToRedisArgs};

/// What a call runs: the check function (checks, refunds, resets), the batch function
/// (several checks of one key) or the configuration one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Check,
    Batch,
    Config,
}

/// One call's keys and arguments, sent as `FCALL` or `EVALSHA` (see `Scripts::invoke`).
///
/// The call is built as the `FCALL` command it is on Redis 7 (`FCALL <function> <key count>
/// <keys...> <args...>`), so that command is sent as it is; `EVALSHA` (the fallback) is
/// built from it when needed.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) which: Which,
    /// How many keys the call has.
    keys: usize,
    /// `FCALL <function> <key count>`, then the keys, then the arguments.
    fcall: Cmd,
}

/// The values of `fcall` before its keys: `FCALL`, the function, the key count.
const HEAD: usize = 3;

/// The largest buffer (bytes) a finished call's command hands on to the next call.
const SPARE_MAX: usize = 4096;

thread_local! {
    /// A finished call's command, cleared, whose buffers the next call on this thread reuses
    /// ([`Cmd::clear`] keeps them): a call then allocates nothing for its command.
    static SPARE: Cell<Option<Cmd>> = const { Cell::new(None) };
}

impl Call {
    /// A call of `function` (the Function library's function for `which`) with `keys` keys,
    /// to be added with [`key`](Self::key) before any argument.
    pub(crate) fn new(which: Which, function: &str, keys: usize) -> Self {
        let mut fcall = SPARE
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_else(|| Cmd::with_capacity(HEAD + 5, 160));
        fcall.arg("FCALL").arg(function).arg(keys);
        Call { which, keys, fcall }
    }

    /// Adds an argument (`ARGV[i]` in the Lua), after every key.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        debug_assert!(
            self.fcall.args_iter().len() >= HEAD + self.keys,
            "an argument before a key"
        );
        self.fcall.arg(arg);
        self
    }

    /// Adds a key (`KEYS[i]` in the Lua); keys come before any argument.
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.fcall.arg(key);
        debug_assert!(
            self.fcall.args_iter().len() <= HEAD + self.keys,
            "more keys than said"
        );
        self
    }

    /// The `FCALL` command of `function`: the one built when it is the call's own function,
    /// else another.
    pub(crate) fn fcall(&self, function: &str) -> std::borrow::Cow<'_, Cmd> {
        let own = matches!(self.fcall.args_iter().nth(1), Some(Arg::Simple(f)) if f == function.as_bytes());
        if own {
            std::borrow::Cow::Borrowed(&self.fcall)
        } else {
            std::borrow::Cow::Owned(self.cmd("FCALL", function))
        }
    }

    /// `<command> <function or sha1> <key count> <keys...> <args...>`.
    pub(crate) fn cmd(&self, command: &str, target: &str) -> Cmd {
        let parts = self.fcall.args_iter().skip(HEAD);
        let len: usize = parts
            .clone()
            .map(|a| match a {
                Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum();
        // The key count has at most 20 digits.
        let mut cmd =
            Cmd::with_capacity(HEAD + parts.len(), command.len() + target.len() + 20 + len);
        cmd.arg(command).arg(target).arg(self.keys);
        for part in parts {
            if let Arg::Simple(b) = part {
                cmd.arg(b);
            }
        }
        cmd
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let mut cmd = std::mem::take(&mut self.fcall);
        // Its buffers are about as large as what it held (a few hundred bytes for a check).
        let held: usize = cmd
            .args_iter()
            .map(|a| match a {
                Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum();
        if held <= SPARE_MAX {
            cmd.clear();
            // Not at all while the thread's locals are being destroyed.
            let _ = SPARE.try_with(|s| s.set(Some(cmd)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_its_command_name_target_key_count_keys_and_arguments_in_order() {
        let mut call = Call::new(Which::Check, "f", 2);
        call.key("k1").key(String::from("k2"));
        call.arg("check defaults 0 1")
            .arg(42_u64)
            .arg(b"\n1.1.1000.9 x".as_slice());
        let packed = |command: &str, target: &str| {
            redis::cmd(command)
                .arg(target)
                .arg(2)
                .arg("k1")
                .arg("k2")
                .arg("check defaults 0 1")
                .arg(42_u64)
                .arg(b"\n1.1.1000.9 x".as_slice())
                .get_packed_command()
        };
        assert_eq!(call.fcall("f").get_packed_command(), packed("FCALL", "f"));
        assert!(matches!(call.fcall("f"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(call.fcall("g").get_packed_command(), packed("FCALL", "g"));
        assert_eq!(
            call.cmd("EVALSHA", "s").get_packed_command(),
            packed("EVALSHA", "s")
        );
        let none = Call::new(Which::Config, "c", 0);
        assert_eq!(
            none.cmd("EVALSHA", "s").get_packed_command(),
            redis::cmd("EVALSHA").arg("s").arg(0).get_packed_command()
        );
        assert_eq!(
            none.fcall("c").get_packed_command(),
            redis::cmd("FCALL").arg("c").arg(0).get_packed_command()
        );
    }

    #[test]
    fn a_call_after_a_finished_one_holds_only_its_own_values() {
        let mut first = Call::new(Which::Check, "f", 1);
        first.key("a-long-key-".repeat(20)).arg("x".repeat(300));
        drop(first);
        let mut second = Call::new(Which::Config, "c", 1);
        second.key("k").arg("v");
        assert_eq!(
            second.fcall("c").get_packed_command(),
            redis::cmd("FCALL")
                .arg("c")
                .arg(1)
                .arg("k")
                .arg("v")
                .get_packed_command()
        );
    }

    /// The packed `<command> <target> <keys.len()> <keys...> <args...>`.
    fn expected(command: &str, target: &str, keys: &[Vec<u8>], args: &[Vec<u8>]) -> Vec<u8> {
        let mut c = redis::cmd(command);
        c.arg(target).arg(keys.len());
        for k in keys {
            c.arg(k.as_slice());
        }
        for a in args {
            c.arg(a.as_slice());
        }
        c.get_packed_command()
    }

    /// A call of `function` with these keys and arguments.
    fn call(which: Which, function: &str, keys: &[Vec<u8>], args: &[Vec<u8>]) -> Call {
        let mut call = Call::new(which, function, keys.len());
        for k in keys {
            call.key(k.as_slice());
        }
        for a in args {
            call.arg(a.as_slice());
        }
        call
    }

    /// Checks every form of `c` (its own FCALL, another function's, EVALSHA).
    fn check_forms(c: &Call, function: &str, keys: &[Vec<u8>], args: &[Vec<u8>]) {
        assert_eq!(
            c.fcall(function).get_packed_command(),
            expected("FCALL", function, keys, args)
        );
        assert!(matches!(c.fcall(function), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            c.fcall("other_fn").get_packed_command(),
            expected("FCALL", "other_fn", keys, args)
        );
        let sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff831";
        assert_eq!(
            c.cmd("EVALSHA", sha).get_packed_command(),
            expected("EVALSHA", sha, keys, args)
        );
    }

    /// A call's keys and arguments.
    type Values = (Vec<Vec<u8>>, Vec<Vec<u8>>);

    fn bytes(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn a_reused_command_carries_nothing_of_the_call_before_in_any_form() {
        // Each previous call: built and sent (its forms made), dropped half built (keys
        // only), of no keys, just under, at and over the spare's cap, with empty values.
        let cap = SPARE_MAX;
        let previous: Vec<Values> = vec![
            (
                vec![bytes("k1"), bytes("k2"), bytes("k3")],
                vec![bytes("a"); 9],
            ),
            (vec![bytes("half-built")], vec![]),
            (vec![], vec![bytes("config"), bytes("x")]),
            (vec![vec![b'k'; cap - 1]], vec![]),
            (vec![vec![b'k'; cap / 2]], vec![vec![b'a'; cap - cap / 2]]),
            (vec![vec![b'k'; cap]], vec![vec![b'a'; 1]]),
            (vec![vec![b'k'; 100_000]], vec![vec![b'a'; 100_000]]),
            (vec![Vec::new(); 3], vec![Vec::new(); 40]),
        ];
        let next: Vec<Values> = vec![
            (
                vec![bytes("ts:{1.2.3.4}")],
                vec![bytes("check defaults 0 1"), bytes("42")],
            ),
            (vec![], vec![]),
            (vec![bytes("only-a-key")], vec![]),
            (vec![bytes("k")], vec![Vec::new()]),
        ];
        for (pk, pa) in &previous {
            for (nk, na) in &next {
                for send_first in [false, true] {
                    let first = call(Which::Check, "turnstile_check_v9", pk, pa);
                    if send_first {
                        check_forms(&first, "turnstile_check_v9", pk, pa);
                    }
                    drop(first);
                    let second = call(Which::Config, "turnstile_config_v9", nk, na);
                    check_forms(&second, "turnstile_config_v9", nk, na);
                    // And the call after that one, built from the same spare.
                    drop(second);
                    let third = call(Which::Check, "f", nk, na);
                    check_forms(&third, "f", nk, na);
                }
            }
        }
    }

    #[test]
    fn calls_alive_together_on_one_thread_keep_their_own_values() {
        let (ka, aa) = (vec![bytes("a-key")], vec![bytes("a-arg"); 3]);
        let (kb, ab) = (vec![bytes("b-key"), bytes("b2")], vec![bytes("b-arg")]);
        drop(call(Which::Check, "f", &[bytes("warm")], &[bytes("spare")]));
        let a = call(Which::Check, "f", &ka, &aa);
        let b = call(Which::Config, "g", &kb, &ab);
        check_forms(&a, "f", &ka, &aa);
        check_forms(&b, "g", &kb, &ab);
        // Dropped in either order; the next calls take whichever command was kept.
        drop(a);
        let c = call(Which::Check, "h", &kb, &aa);
        check_forms(&b, "g", &kb, &ab);
        drop(b);
        let d = call(Which::Check, "i", &ka, &ab);
        check_forms(&c, "h", &kb, &aa);
        check_forms(&d, "i", &ka, &ab);
    }

    #[test]
    fn calls_on_many_threads_each_hold_only_their_own_values() {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    for i in 0..300u64 {
                        // A small xorshift: sizes from none to well over the spare's cap.
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let keys: Vec<Vec<u8>> = (0..x % 4)
                            .map(|j| format!("t{t}-i{i}-k{j}").into_bytes())
                            .collect();
                        let args: Vec<Vec<u8>> = (0..(x >> 8) % 6)
                            .map(|j| vec![b'a' + (j as u8); ((x >> (16 + j)) % 5_000) as usize])
                            .collect();
                        let c = call(Which::Check, "f", &keys, &args);
                        check_forms(&c, "f", &keys, &args);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_finished_call_hands_on_its_command_cleared_and_only_under_the_cap() {
        let spare = || SPARE.with(Cell::take);
        // "FCALL", "f" and the key count "1": 7 bytes before the key.
        for (held, kept) in [(8, true), (SPARE_MAX, true), (SPARE_MAX + 1, false)] {
            drop(spare());
            let c = call(Which::Check, "f", &[vec![b'k'; held - 7]], &[]);
            drop(c);
            let left = spare();
            assert_eq!(left.is_some(), kept, "{held}");
            if let Some(cmd) = left {
                assert_eq!(cmd.args_iter().count(), 0, "{held}");
                assert!(cmd.get_packed_command().is_empty(), "{held}");
            }
        }
    }
}
