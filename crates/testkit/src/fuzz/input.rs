//! A tiny reader of structure from fuzz bytes.
//!
//! The harnesses decode their inputs with this instead of the `arbitrary` crate so that the
//! same harness files compile unchanged inside the main workspace's regression tests (which
//! replay saved crash inputs through them) without adding a dependency there. Reading past
//! the end yields zeros, so every byte string is a valid input.
#![allow(dead_code, unreachable_pub)]

/// A cursor over fuzz bytes.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads from `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte, or 0 past the end.
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            self.byte() as usize % n
        } else {
            self.u32() as usize % n
        }
    }

    /// One element of `items`.
    pub fn pick<'t, T>(&mut self, items: &'t [T]) -> &'t T {
        &items[self.below(items.len())]
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// A length-prefixed byte string of at most `max` bytes.
    pub fn chunk(&mut self, max: usize) -> &'a [u8] {
        let n = self.below(max + 1);
        self.bytes(n)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// Writes inputs that [`Input`] reads back: used to build seed corpora from real traffic.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    /// The bytes written so far.
    pub out: Vec<u8>,
}

impl Encoder {
    /// One byte.
    pub fn byte(&mut self, b: u8) -> &mut Self {
        self.out.push(b);
        self
    }

    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A chunk as [`Input::chunk`] reads it with the same `max` (`bytes.len() <= max`).
    pub fn chunk(&mut self, bytes: &[u8], max: usize) -> &mut Self {
        assert!(bytes.len() <= max);
        if max < 256 {
            self.byte(bytes.len() as u8);
        } else {
            self.u32(bytes.len() as u32);
        }
        self.out.extend_from_slice(bytes);
        self
    }

    /// Raw bytes.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.out.extend_from_slice(bytes);
        self
    }
}

/// Whether any thread of this process panicked since [`watch_panics`] was first called.
///
/// libFuzzer aborts on any panic by itself; the regression tests replay inputs in the normal
/// test harness, where a panic on a spawned task or thread would otherwise go unnoticed.
pub fn panicked() -> bool {
    PANICKED.load(std::sync::atomic::Ordering::SeqCst)
}

static PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs (once) a panic hook that records every panic and then runs the previous hook.
pub fn watch_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, std::sync::atomic::Ordering::SeqCst);
            previous(info);
        }));
    });
}
