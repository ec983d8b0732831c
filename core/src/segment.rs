//! The segment codec.
//!
//! A segment is the immutable unit of storage: a run of consecutive offsets of one
//! partition, in order. Offsets are not stored: entry `i` of a segment whose first offset is
//! `f` has offset `f + i`. An entry is a message (message id, transaction id, payload and,
//! from version 2, the time it was pushed) or a gap: an offset that a push reserved and
//! never wrote (it aborted, or its item was a duplicate). Gaps appear when compaction
//! merges the segments of many small pushes into one.
//!
//! Layout (all integers are LEB128 varints unless said):
//!
//! ```text
//! magic "QS" | version u8 (1, 2 or 3) | [v2, v3: base_time, zigzag varint] | entry_count | block_count
//! per block:  entries_in_block | raw_len | stored_len | codec u8 (0 raw, 1 zstd) | crc32 u32 LE
//! block bodies, concatenated in order
//! ```
//!
//! A block body holds `entries_in_block` entries. Version 1 (every entry a message):
//! `message_id [16] | txid_len | txid (UTF-8) | payload_len | payload`. Version 2:
//! `kind u8`, then for kind 0 (message) `message_id [16] | time_delta (zigzag varint,
//! microseconds after base_time) | txid_len | txid | payload_len | payload`, and nothing
//! more for kind 1 (gap). Version 3 is version 2 plus kind 2, a message with extensions:
//! kind 0's fields, then `flags u8` and, in flag order, `headers_len | headers` (flag 1:
//! jsonb bytes, or an envelope when the queue is encrypted) and `deliver_at` (flag 2: the
//! time before which it is not delivered, a zigzag varint of microseconds after
//! base_time). Flag 4 adds no field: the transaction id is the message id's canonical
//! text, and `txid_len` must be 0 (else `TxStoredAndDerived`). A flag this code does not
//! know is an error. A segment is written as version 3 only when one of its messages has
//! headers, a delivery time or a transaction id that is its message id's text (what a push
//! given none gets), so other segments keep the version 2 bytes, and a reader that knows
//! only versions 1 and 2 refuses a version 3 segment instead of misreading it. Any other
//! kind is an error, so a later kind cannot be misread.
//! Blocks are compressed one by one so that a pop decodes only the blocks it needs, not
//! the whole segment. A block is kept raw when zstd would not make it smaller. The CRC32
//! of each block's raw bytes (and, from version 2, of the base time) turns corruption into
//! an error instead of a wrong payload or time.
//!
//! `Encoder` writes a segment one entry at a time, closing each block as soon as it is
//! full, so a large segment (a compaction's merge) never has all its raw frames in memory;
//! `encode` and `encode_uncompressed` use it.

use std::fmt;

const MAGIC: &[u8; 2] = b"QS";
const VERSION_1: u8 = 1;
const VERSION: u8 = 2;
/// Version 2 plus `KIND_EXTENDED`: written only when a message needs it.
const VERSION_3: u8 = 3;
const KIND_MESSAGE: u8 = 0;
const KIND_GAP: u8 = 1;
const KIND_EXTENDED: u8 = 2;
/// Flags of an extended message: what follows its payload.
const HAS_HEADERS: u8 = 1;
const HAS_DELIVER_AT: u8 = 2;
/// The transaction id is the message id's text (`ids::uuid_text`), not stored. A push
/// given no transaction id uses that text, so most messages would otherwise carry 36
/// bytes that compress badly (hex digits of random bits).
const TX_FROM_ID: u8 = 4;
const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

/// Frames per block at most; a block also closes once its raw size passes `BLOCK_BYTES`.
pub const BLOCK_FRAMES: usize = 64;
pub const BLOCK_BYTES: usize = 32 * 1024;
/// zstd level: the fastest levels compress JSON well and keep push cheap.
const ZSTD_LEVEL: i32 = 1;
/// Blocks shorter than this are stored raw: zstd's frame overhead eats what it would save.
const MIN_COMPRESS: usize = 128;
/// Hard ceiling on a block's decompressed size, so a corrupt header cannot make us
/// allocate without bound. A single frame may exceed BLOCK_BYTES (one big payload).
const MAX_RAW_BLOCK: usize = 1 << 30;

thread_local! {
    // zstd contexts are costly to create; a backend keeps one of each.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static BLOCKS: std::cell::RefCell<BlockCache> = const { std::cell::RefCell::new(BlockCache::new()) };
}

/// Where a stored segment sits: its partition and its offsets. What a committed offset of
/// a partition holds never changes (compaction and rotation move it, never alter it), so a
/// block of a segment at a place, with a given checksum, always decodes to the same frames.
/// Only a transaction's own uncommitted pushes can be read before they commit, and their
/// offsets may hold something else after a rollback: the session forgets every cached
/// block when a transaction or subtransaction aborts (`forget_blocks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub partition: [u8; 16],
    pub first: i64,
    pub last: i64,
}

/// Decompressed blocks a backend read last, by place, block and checksum: a consumer that
/// takes a few messages of a block per pop (a batch shared by many partitions) would
/// otherwise decompress the whole block again each time. Bounded in entries and bytes;
/// the oldest goes first.
struct BlockCache {
    entries: std::collections::VecDeque<(BlockKey, std::rc::Rc<Vec<u8>>)>,
    bytes: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct BlockKey {
    place: Place,
    version: u8,
    first_index: usize,
    crc: u32,
    raw_len: usize,
}

/// Forgets every block this thread keeps (a transaction or subtransaction aborted: see
/// `Place`).
pub fn forget_blocks() {
    BLOCKS.with(|c| {
        let mut c = c.borrow_mut();
        c.entries.clear();
        c.bytes = 0;
    });
}

/// Most blocks, and most decompressed bytes, a backend keeps.
const CACHE_BLOCKS: usize = 64;
const CACHE_BYTES: usize = 2 << 20;

impl BlockCache {
    const fn new() -> Self {
        BlockCache { entries: std::collections::VecDeque::new(), bytes: 0 }
    }

    fn get(&self, key: &BlockKey) -> Option<std::rc::Rc<Vec<u8>>> {
        self.entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn put(&mut self, key: BlockKey, raw: std::rc::Rc<Vec<u8>>) {
        if raw.len() > CACHE_BYTES / 4 {
            return; // a block of one huge message: not worth the room
        }
        self.bytes += raw.len();
        self.entries.push_back((key, raw));
        while self.entries.len() > CACHE_BLOCKS || self.bytes > CACHE_BYTES {
            let (_, old) = self.entries.pop_front().expect("not empty");
            self.bytes -= old.len();
        }
    }
}

/// One message as written by push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    pub message_id: [u8; 16],
    pub transaction_id: &'a str,
    pub payload: &'a [u8],
    /// When it was pushed (microseconds since 2000-01-01, PostgreSQL's epoch). Version 1
    /// segments do not store it: None when read from one (the segment row's time applies).
    /// Written as the segment's first time when None.
    pub created_at: Option<i64>,
    /// The message's headers as stored: jsonb bytes, or an envelope of an encrypted
    /// queue. None: the message has none (every message of a version 1 or 2 segment).
    pub headers: Option<&'a [u8]>,
    /// Not delivered before this time (microseconds since 2000-01-01), when the producer
    /// said so (`push(..., deliver_at)`); None otherwise.
    pub deliver_at: Option<i64>,
}

impl Frame<'_> {
    fn flags(&self) -> u8 {
        (if self.headers.is_some() { HAS_HEADERS } else { 0 })
            | (if self.deliver_at.is_some() { HAS_DELIVER_AT } else { 0 })
            | (if self.tx_from_id() { TX_FROM_ID } else { 0 })
    }

    /// Whether the transaction id is exactly the message id's canonical text, so that it
    /// need not be stored (flag `TX_FROM_ID`): a decoder gives back the same string.
    fn tx_from_id(&self) -> bool {
        self.transaction_id.as_bytes() == crate::ids::uuid_text(&self.message_id)
    }
}

/// Appends one message frame (version 2 or 3, as the layout above) with its `flags`
/// (`Frame::flags`) to a block's raw bytes; its time is stored relative to `base`.
fn put_frame(raw: &mut Vec<u8>, frame: &Frame<'_>, flags: u8, base: i64) {
    let tx = if flags & TX_FROM_ID != 0 { &[][..] } else { frame.transaction_id.as_bytes() };
    // One allocation per frame at most (five varints of up to 10 bytes each).
    raw.reserve(18 + 50 + tx.len() + frame.payload.len() + frame.headers.map_or(0, <[u8]>::len));
    raw.push(if flags != 0 { KIND_EXTENDED } else { KIND_MESSAGE });
    raw.extend_from_slice(&frame.message_id);
    put_varint(raw, zigzag(frame.created_at.unwrap_or(base).wrapping_sub(base)));
    put_varint(raw, tx.len() as u64);
    raw.extend_from_slice(tx);
    put_varint(raw, frame.payload.len() as u64);
    raw.extend_from_slice(frame.payload);
    if flags != 0 {
        raw.push(flags);
    }
    if let Some(headers) = frame.headers {
        put_varint(raw, headers.len() as u64);
        raw.extend_from_slice(headers);
    }
    if let Some(at) = frame.deliver_at {
        put_varint(raw, zigzag(at.wrapping_sub(base)));
    }
}

/// One offset of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry<'a> {
    Message(Frame<'a>),
    /// An offset that holds no message (a push that aborted or skipped a duplicate).
    Gap,
}

/// Why a segment could not be decoded. Every variant means the stored bytes are not a
/// segment this code wrote; callers turn it into an ERROR, never a wrong payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    Truncated(&'static str),
    BadMagic,
    UnsupportedVersion(u8),
    UnknownCodec(u8),
    Decompress(String),
    LengthMismatch { expected: usize, got: usize },
    FrameCountMismatch,
    InvalidUtf8,
    TrailingBytes,
    TooLarge,
    Checksum,
    UnknownKind(u8),
    UnknownFlags(u8),
    TxStoredAndDerived,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Truncated(what) => write!(f, "segment truncated in {what}"),
            CodecError::BadMagic => write!(f, "not a queen segment (bad magic)"),
            CodecError::UnsupportedVersion(v) => write!(f, "unsupported segment version {v}"),
            CodecError::UnknownCodec(c) => write!(f, "unknown block codec {c}"),
            CodecError::Decompress(e) => write!(f, "block decompression failed: {e}"),
            CodecError::LengthMismatch { expected, got } => {
                write!(f, "block length mismatch: expected {expected} bytes, got {got}")
            }
            CodecError::FrameCountMismatch => write!(f, "frame count does not match blocks"),
            CodecError::InvalidUtf8 => write!(f, "transaction id is not UTF-8"),
            CodecError::TrailingBytes => write!(f, "trailing bytes after last block"),
            CodecError::TooLarge => write!(f, "block larger than the codec allows"),
            CodecError::Checksum => write!(f, "block checksum mismatch"),
            CodecError::UnknownKind(k) => write!(f, "unknown entry kind {k}"),
            CodecError::UnknownFlags(k) => write!(f, "unknown message flags {k:#04x}"),
            CodecError::TxStoredAndDerived => {
                write!(f, "a message's transaction id is both stored and derived from its message id")
            }
        }
    }
}

impl std::error::Error for CodecError {}

/// A block's checksum: of its raw bytes and, from version 2, of the segment's base time,
/// which every time in the block depends on.
fn block_crc(version: u8, base_time: i64, raw: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if let Some(salt) = crc_salt(version, base_time) {
        h.update(&salt.to_le_bytes());
    }
    h.update(raw);
    h.finalize()
}

/// What a block's checksum covers besides its raw bytes. Versions 2 and 3 share it (the
/// base time), so a segment that turns out to need version 3 keeps its blocks' checksums.
fn crc_salt(version: u8, base_time: i64) -> Option<i64> {
    (version != VERSION_1).then_some(base_time)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    fn varint(&mut self, what: &'static str) -> Result<u64, CodecError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or(CodecError::Truncated(what))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(CodecError::TooLarge)
    }
    fn usize(&mut self, what: &'static str) -> Result<usize, CodecError> {
        usize::try_from(self.varint(what)?).map_err(|_| CodecError::TooLarge)
    }
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CodecError> {
        let end = self.pos.checked_add(n).ok_or(CodecError::Truncated(what))?;
        let s = self.buf.get(self.pos..end).ok_or(CodecError::Truncated(what))?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.bytes(1, what)?[0])
    }
    fn done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

/// Encodes entries (messages and gaps, one per offset) into one segment, compressing its
/// blocks where that makes them smaller.
pub fn encode<'a, I>(entries: I) -> Vec<u8>
where
    I: IntoIterator<Item = Entry<'a>>,
{
    encode_with(entries, true)
}

/// Encodes without compressing: for segments that compaction soon reads and merges (the
/// fresh tier), where compressing a message or two would cost more than it saves.
pub fn encode_uncompressed<'a, I>(entries: I) -> Vec<u8>
where
    I: IntoIterator<Item = Entry<'a>>,
{
    encode_with(entries, false)
}

fn encode_with<'a, I>(entries: I, compress: bool) -> Vec<u8>
where
    I: IntoIterator<Item = Entry<'a>>,
{
    let mut encoder = Encoder::new(compress);
    for entry in entries {
        encoder.push(entry);
    }
    encoder.finish()
}

/// Encodes a segment one entry at a time (`encode` is this over an iterator). Each block is
/// compressed and checksummed as soon as it is full, so the encoder holds the stored bodies
/// of the closed blocks and the raw bytes of one open block, never every raw frame.
///
/// A block's checksum depends on the segment's version and base time, which may become
/// known only after some blocks closed: the base time with the first message (blocks of
/// gaps only may come before it), version 3 with the first message that needs it. When
/// what the checksum covers changes (`crc_salt`: today only the base time does), the
/// closed blocks' checksums are computed again, one block at a time.
pub struct Encoder {
    compress: bool,
    version: u8,
    /// The first message's time: None while only gaps were pushed.
    base: Option<i64>,
    count: u64,
    /// The closed blocks, whose stored bodies are `bodies`, concatenated in order.
    closed: Vec<ClosedBlock>,
    bodies: Vec<u8>,
    /// The open block: its entries and raw bytes.
    open_entries: usize,
    open: Vec<u8>,
}

struct ClosedBlock {
    entries: usize,
    raw_len: usize,
    stored_len: usize,
    codec: u8,
    crc: u32,
}

impl Encoder {
    /// An encoder that compresses blocks where that makes them smaller (`compress`), or
    /// stores them raw.
    pub fn new(compress: bool) -> Self {
        Encoder {
            compress,
            version: VERSION,
            base: None,
            count: 0,
            closed: Vec::new(),
            bodies: Vec::new(),
            open_entries: 0,
            open: Vec::new(),
        }
    }

    /// Entries pushed so far.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends the entry of the next offset.
    pub fn push(&mut self, entry: Entry<'_>) {
        match entry {
            Entry::Gap => self.open.push(KIND_GAP),
            Entry::Message(frame) => {
                let flags = frame.flags();
                let salt = crc_salt(self.version, self.base.unwrap_or(0));
                let base = *self.base.get_or_insert(frame.created_at.unwrap_or(0));
                if flags != 0 {
                    self.version = VERSION_3;
                }
                // The closed blocks were checksummed for what was known then.
                if crc_salt(self.version, base) != salt {
                    self.recompute_crcs();
                }
                put_frame(&mut self.open, &frame, flags, base);
            }
        }
        self.open_entries += 1;
        self.count += 1;
        if self.open_entries >= BLOCK_FRAMES || self.open.len() >= BLOCK_BYTES {
            self.close_block();
        }
    }

    /// Compresses (or keeps raw) and checksums the open block, and starts a new one.
    fn close_block(&mut self) {
        let raw = std::mem::take(&mut self.open);
        let entries = std::mem::take(&mut self.open_entries);
        // A block too small to gain anything stays raw without asking zstd.
        let compressed = (self.compress && raw.len() >= MIN_COMPRESS)
            .then(|| {
                COMPRESSOR.with(|c| {
                    let mut c = c.borrow_mut();
                    let c = c.get_or_insert_with(|| zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd context"));
                    c.compress(&raw).ok()
                })
            })
            .flatten();
        let crc = block_crc(self.version, self.base.unwrap_or(0), &raw);
        let raw_len = raw.len();
        let (codec, stored_len) = match compressed {
            Some(c) if c.len() < raw_len => {
                self.bodies.extend_from_slice(&c);
                (CODEC_ZSTD, c.len())
            }
            // The first body kept raw becomes the bodies' buffer (a single message's
            // segment then copies it once less).
            _ if self.bodies.is_empty() => {
                self.bodies = raw;
                (CODEC_RAW, raw_len)
            }
            _ => {
                self.bodies.extend_from_slice(&raw);
                (CODEC_RAW, raw_len)
            }
        };
        self.closed.push(ClosedBlock { entries, raw_len, stored_len, codec, crc });
    }

    /// Checksums the closed blocks again, for the version and base time now known: a zstd
    /// body is decompressed for it, one block at a time. (Blocks closed before the base
    /// time is known hold gaps only: a few bytes, stored raw.)
    fn recompute_crcs(&mut self) {
        let (version, base) = (self.version, self.base.unwrap_or(0));
        let mut at = 0;
        for block in &mut self.closed {
            let body = &self.bodies[at..at + block.stored_len];
            at += block.stored_len;
            block.crc = if block.codec == CODEC_RAW {
                block_crc(version, base, body)
            } else {
                let raw = DECOMPRESSOR.with(|d| {
                    let mut d = d.borrow_mut();
                    let d = d.get_or_insert_with(|| zstd::bulk::Decompressor::new().expect("zstd context"));
                    d.decompress(body, block.raw_len).expect("a block this encoder compressed decompresses")
                });
                block_crc(version, base, &raw)
            };
        }
    }

    /// The segment's bytes: the header, then the blocks' bodies.
    pub fn finish(mut self) -> Vec<u8> {
        if self.open_entries > 0 {
            self.close_block();
        }
        let mut header = Vec::with_capacity(24 + self.closed.len() * 12);
        header.extend_from_slice(MAGIC);
        header.push(self.version);
        put_varint(&mut header, zigzag(self.base.unwrap_or(0)));
        put_varint(&mut header, self.count);
        put_varint(&mut header, self.closed.len() as u64);
        for block in &self.closed {
            put_varint(&mut header, block.entries as u64);
            put_varint(&mut header, block.raw_len as u64);
            put_varint(&mut header, block.stored_len as u64);
            header.push(block.codec);
            header.extend_from_slice(&block.crc.to_le_bytes());
        }
        // The header goes in front of the bodies, moved within their buffer (no second one).
        let mut out = self.bodies;
        let body_len = out.len();
        out.reserve_exact(header.len());
        out.resize(body_len + header.len(), 0);
        out.copy_within(0..body_len, header.len());
        out[..header.len()].copy_from_slice(&header);
        out
    }
}

/// A segment's header: where each block lies and how many frames it holds. It can be
/// parsed from the first bytes of a segment alone, so that a reader fetches only the
/// header and then the blocks it needs (see `span`), not the whole segment.
#[derive(Debug)]
pub struct Directory {
    version: u8,
    base_time: i64,
    frame_count: usize,
    blocks: Vec<BlockHead>,
}

/// One block of a segment (`Directory::blocks`): its frames, `first_index..first_index +
/// frames`, and its stored body, bytes `start..end` of the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpan {
    pub first_index: usize,
    pub frames: usize,
    pub start: usize,
    pub end: usize,
}

/// Consecutive blocks of a segment (`Directory::chunk`): the frames `from..to` a reader
/// asked for that they hold, and their stored bodies, bytes `start..end` of the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub from: usize,
    pub to: usize,
    pub start: usize,
    pub end: usize,
}

#[derive(Debug)]
struct BlockHead {
    first_index: usize,
    frames: usize,
    raw_len: usize,
    stored_len: usize,
    codec: u8,
    crc: u32,
    /// Where the block's body starts, from the start of the segment.
    body_start: usize,
}

impl Directory {
    /// Parses the header from `prefix`, the first bytes of a segment of `total_len`
    /// bytes. `Truncated` when the prefix ends inside the header: a caller holding only a
    /// prefix fetches a longer one. Block bodies are neither read nor checked here.
    pub fn parse(prefix: &[u8], total_len: usize) -> Result<Directory, CodecError> {
        let mut r = Reader::new(prefix);
        if r.bytes(2, "magic")? != MAGIC {
            return Err(CodecError::BadMagic);
        }
        let version = r.u8("version")?;
        if !matches!(version, VERSION_1 | VERSION | VERSION_3) {
            return Err(CodecError::UnsupportedVersion(version));
        }
        let base_time = if version == VERSION_1 { 0 } else { unzigzag(r.varint("base time")?) };
        let frame_count = r.usize("frame count")?;
        let block_count = r.usize("block count")?;
        // Every block header takes at least 8 bytes: refuse counts the input cannot hold.
        if block_count > total_len / 8 {
            return Err(CodecError::Truncated("block directory"));
        }
        let mut blocks = Vec::with_capacity(block_count);
        let mut first_index = 0usize;
        for _ in 0..block_count {
            let frames = r.usize("block header")?;
            let raw_len = r.usize("block header")?;
            let stored_len = r.usize("block header")?;
            let codec = r.u8("block header")?;
            let crc = u32::from_le_bytes(r.bytes(4, "block header")?.try_into().unwrap());
            if codec != CODEC_RAW && codec != CODEC_ZSTD {
                return Err(CodecError::UnknownCodec(codec));
            }
            if raw_len > MAX_RAW_BLOCK {
                return Err(CodecError::TooLarge);
            }
            if frames == 0 {
                return Err(CodecError::FrameCountMismatch);
            }
            if codec == CODEC_RAW && stored_len != raw_len {
                return Err(CodecError::LengthMismatch { expected: raw_len, got: stored_len });
            }
            blocks.push(BlockHead { first_index, frames, raw_len, stored_len, codec, crc, body_start: 0 });
            first_index = first_index.checked_add(frames).ok_or(CodecError::FrameCountMismatch)?;
        }
        if first_index != frame_count {
            return Err(CodecError::FrameCountMismatch);
        }
        let mut at = r.pos;
        for b in &mut blocks {
            b.body_start = at;
            at = at.checked_add(b.stored_len).ok_or(CodecError::Truncated("block body"))?;
        }
        if at > total_len {
            return Err(CodecError::Truncated("block body"));
        }
        if at < total_len {
            return Err(CodecError::TrailingBytes);
        }
        Ok(Directory { version, base_time, frame_count, blocks })
    }

    pub fn frame_count(&self) -> usize {
        self.frame_count
    }

    /// The bytes `[start, end)` of the segment that hold frames `from..to` (clamped to
    /// the segment), or None when that span is empty.
    pub fn span(&self, from: usize, to: usize) -> Option<(usize, usize)> {
        let mut hit = self.blocks(from, to);
        let first = hit.next()?;
        let last = hit.next_back().unwrap_or(first);
        Some((first.start, last.end))
    }

    /// The blocks that hold frames `from..to` (clamped to the segment), in order.
    pub fn blocks(&self, from: usize, to: usize) -> impl DoubleEndedIterator<Item = BlockSpan> + '_ {
        let to = to.min(self.frame_count);
        let first = self.blocks.partition_point(|b| b.first_index + b.frames <= from);
        let end = self.blocks.partition_point(|b| b.first_index < to);
        let blocks: &[BlockHead] = if from < to { &self.blocks[first..end] } else { &[] };
        blocks.iter().map(|b| BlockSpan {
            first_index: b.first_index,
            frames: b.frames,
            start: b.body_start,
            end: b.body_start + b.stored_len,
        })
    }

    /// The first blocks that hold frames `from..to` (clamped to the segment): as many as
    /// `limit` stored bytes hold, and at least one, however large. None when the span is
    /// empty. A reader that fetches a span a chunk at a time asks for the next chunk from
    /// the previous one's `to`.
    pub fn chunk(&self, from: usize, to: usize, limit: usize) -> Option<Chunk> {
        let mut hit = self.blocks(from, to);
        let first = hit.next()?;
        let mut last = first;
        for b in hit {
            if b.end - first.start > limit {
                break;
            }
            last = b;
        }
        Some(Chunk {
            from: from.max(first.first_index),
            to: to.min(last.first_index + last.frames),
            start: first.start,
            end: last.end,
        })
    }

    /// Calls `f(index, frame)` for frames `from..to` (clamped to the segment), where
    /// `bytes` holds the segment's bytes from offset `bytes_start` on: at least the
    /// `span(from, to)`. Only the blocks that hold those frames are decompressed.
    pub fn for_each_in<F>(
        &self,
        bytes: &[u8],
        bytes_start: usize,
        from: usize,
        to: usize,
        f: F,
    ) -> Result<(), CodecError>
    where
        F: FnMut(usize, Entry<'_>),
    {
        self.for_each_in_at(None, bytes, bytes_start, from, to, f)
    }

    /// `for_each_in` for a segment stored at `place`: its decompressed blocks are kept in
    /// this thread's cache (see `BlockCache`) and taken from it.
    pub fn for_each_in_at<F>(
        &self,
        place: Option<Place>,
        bytes: &[u8],
        bytes_start: usize,
        from: usize,
        to: usize,
        mut f: F,
    ) -> Result<(), CodecError>
    where
        F: FnMut(usize, Entry<'_>),
    {
        let to = to.min(self.frame_count);
        if from >= to {
            return Ok(());
        }
        let first = self.blocks.partition_point(|b| b.first_index + b.frames <= from);
        for block in self.blocks[first..].iter().take_while(|b| b.first_index < to) {
            let raw = self.block_bytes(block, place, bytes, bytes_start)?;
            self.block_frames(block, raw.as_slice(), from, to, &mut f)?;
        }
        Ok(())
    }

    /// A block's bytes once decompressed and checked against its CRC: the stored body of
    /// an uncompressed block, else the copy in this thread's cache (checked when it was
    /// put there), else a fresh decompression (put in the cache when `place` is known).
    fn block_bytes<'b>(
        &self,
        block: &BlockHead,
        place: Option<Place>,
        bytes: &'b [u8],
        bytes_start: usize,
    ) -> Result<BlockBytes<'b>, CodecError> {
        let body = block
            .body_start
            .checked_sub(bytes_start)
            .and_then(|s| bytes.get(s..s + block.stored_len))
            .ok_or(CodecError::Truncated("block body"))?;
        if block.codec == CODEC_RAW {
            if block_crc(self.version, self.base_time, body) != block.crc {
                return Err(CodecError::Checksum);
            }
            return Ok(BlockBytes::Stored(body));
        }
        let key = place.map(|place| BlockKey {
            place,
            version: self.version,
            first_index: block.first_index,
            crc: block.crc,
            raw_len: block.raw_len,
        });
        if let Some(hit) = key.and_then(|key| BLOCKS.with(|c| c.borrow().get(&key))) {
            return Ok(BlockBytes::Decoded(hit));
        }
        let out = DECOMPRESSOR
            .with(|d| {
                let mut d = d.borrow_mut();
                let d = d.get_or_insert_with(|| zstd::bulk::Decompressor::new().expect("zstd context"));
                d.decompress(body, block.raw_len)
            })
            .map_err(|e| CodecError::Decompress(e.to_string()))?;
        if out.len() != block.raw_len {
            return Err(CodecError::LengthMismatch { expected: block.raw_len, got: out.len() });
        }
        if block_crc(self.version, self.base_time, &out) != block.crc {
            return Err(CodecError::Checksum);
        }
        let out = std::rc::Rc::new(out);
        if let Some(key) = key {
            BLOCKS.with(|c| c.borrow_mut().put(key, out.clone()));
        }
        Ok(BlockBytes::Decoded(out))
    }

    /// Walks every frame of one block (`raw`, its decompressed bytes) and calls `f` for
    /// those with an index in `from..to`. Every frame is parsed, so a malformed one fails
    /// the block wherever it is.
    fn block_frames<F>(
        &self,
        block: &BlockHead,
        raw: &[u8],
        from: usize,
        to: usize,
        f: &mut F,
    ) -> Result<(), CodecError>
    where
        F: FnMut(usize, Entry<'_>),
    {
        let mut r = Reader::new(raw);
        for i in 0..block.frames {
            let index = block.first_index + i;
            let wanted = index >= from && index < to;
            let kind = if self.version == VERSION_1 { KIND_MESSAGE } else { r.u8("entry kind")? };
            match kind {
                KIND_GAP => {
                    if wanted {
                        f(index, Entry::Gap);
                    }
                    continue;
                }
                KIND_MESSAGE => {}
                KIND_EXTENDED if self.version == VERSION_3 => {}
                other => return Err(CodecError::UnknownKind(other)),
            }
            let frame = self.message_frame(&mut r, kind)?;
            if wanted {
                let mut text = [0u8; 36];
                f(index, Entry::Message(frame.checked(&mut text)?));
            }
        }
        if !r.done() {
            return Err(CodecError::TrailingBytes);
        }
        Ok(())
    }

    /// The fields of one message frame (its kind byte already read), as stored.
    fn message_frame<'r>(&self, r: &mut Reader<'r>, kind: u8) -> Result<StoredFrame<'r>, CodecError> {
        let id = r.bytes(16, "message id")?;
        let created_at = if self.version == VERSION_1 {
            None
        } else {
            Some(self.base_time.wrapping_add(unzigzag(r.varint("time")?)))
        };
        let tx_len = r.usize("transaction id length")?;
        let tx = r.bytes(tx_len, "transaction id")?;
        let pl_len = r.usize("payload length")?;
        let payload = r.bytes(pl_len, "payload")?;
        let flags = if kind == KIND_EXTENDED { r.u8("flags")? } else { 0 };
        if flags & !(HAS_HEADERS | HAS_DELIVER_AT | TX_FROM_ID) != 0 {
            return Err(CodecError::UnknownFlags(flags));
        }
        let tx_from_id = flags & TX_FROM_ID != 0;
        if tx_from_id && !tx.is_empty() {
            return Err(CodecError::TxStoredAndDerived);
        }
        let headers = if flags & HAS_HEADERS != 0 {
            let len = r.usize("headers length")?;
            Some(r.bytes(len, "headers")?)
        } else {
            None
        };
        let deliver_at = if flags & HAS_DELIVER_AT != 0 {
            Some(self.base_time.wrapping_add(unzigzag(r.varint("delivery time")?)))
        } else {
            None
        };
        Ok(StoredFrame { id, created_at, tx, tx_from_id, payload, headers, deliver_at })
    }
}

/// A block's decompressed bytes (`Directory::block_bytes`).
enum BlockBytes<'b> {
    /// An uncompressed block's body, in the segment's bytes.
    Stored(&'b [u8]),
    /// A decompressed copy, shared with this thread's block cache.
    Decoded(std::rc::Rc<Vec<u8>>),
}

impl BlockBytes<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            BlockBytes::Stored(b) => b,
            BlockBytes::Decoded(b) => b,
        }
    }
}

/// One message frame's fields as stored, before the checks a delivered frame gets.
struct StoredFrame<'r> {
    id: &'r [u8],
    created_at: Option<i64>,
    tx: &'r [u8],
    /// The transaction id is the message id's text (flag `TX_FROM_ID`; `tx` is empty).
    tx_from_id: bool,
    payload: &'r [u8],
    headers: Option<&'r [u8]>,
    deliver_at: Option<i64>,
}

impl<'r> StoredFrame<'r> {
    /// The frame handed out: a stored transaction id must be UTF-8. One derived from the
    /// message id (`TX_FROM_ID`) is written into `text`, a buffer the caller keeps for as
    /// long as it uses the frame, since a frame's transaction id is a borrowed `&str`.
    fn checked<'s>(self, text: &'s mut [u8; 36]) -> Result<Frame<'s>, CodecError>
    where
        'r: 's,
    {
        let mut message_id = [0u8; 16];
        message_id.copy_from_slice(self.id);
        let transaction_id: &'s str = if self.tx_from_id {
            *text = crate::ids::uuid_text(&message_id);
            std::str::from_utf8(&text[..]).expect("a UUID's text is ASCII")
        } else {
            std::str::from_utf8(self.tx).map_err(|_| CodecError::InvalidUtf8)?
        };
        Ok(Frame {
            message_id,
            transaction_id,
            payload: self.payload,
            created_at: self.created_at,
            headers: self.headers,
            deliver_at: self.deliver_at,
        })
    }
}

/// A whole segment in memory: its directory and its bytes.
#[derive(Debug)]
pub struct Segment<'a> {
    dir: Directory,
    bytes: &'a [u8],
}

impl<'a> Segment<'a> {
    /// Parses and checks the header. Block bodies are not decompressed yet.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, CodecError> {
        Ok(Segment { dir: Directory::parse(bytes, bytes.len())?, bytes })
    }

    pub fn frame_count(&self) -> usize {
        self.dir.frame_count
    }

    /// Calls `f(index, frame)` for frames `from..to` (indexes within the segment, clamped
    /// to its length), decompressing only the blocks that hold them.
    pub fn for_each_in<F>(&self, from: usize, to: usize, f: F) -> Result<(), CodecError>
    where
        F: FnMut(usize, Entry<'_>),
    {
        self.dir.for_each_in(self.bytes, 0, from, to, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (message id, transaction id, payload, time, headers, delivery time)
    type Owned = ([u8; 16], String, Vec<u8>, i64, Option<Vec<u8>>, Option<i64>);

    fn owned(n: usize, payload_len: usize) -> Vec<Option<Owned>> {
        (0..n)
            .map(|i| {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&(i as u64).to_be_bytes());
                let payload = format!("{{\"i\": {i}, \"pad\": \"{}\"}}", "x".repeat(payload_len));
                // Every fifth message carries headers; the others none.
                let headers =
                    (i % 5 == 3).then(|| format!("{{\"traceparent\": \"00-{i:032x}-{i:016x}-01\"}}").into_bytes());
                // Every seventh a delivery time (before or after its own time).
                let t = 800_000_000_000_000 + (i as i64 % 7) * 1000 - 3000;
                let deliver_at = (i % 7 == 2).then(|| t + (i as i64 - 50) * 1_000_000);
                Some((id, format!("tx-{i}"), payload.into_bytes(), t, headers, deliver_at))
            })
            .collect()
    }

    /// `owned` without headers or delivery times: messages a version 2 segment can hold.
    fn plain_owned(n: usize, payload_len: usize) -> Vec<Option<Owned>> {
        let mut data = owned(n, payload_len);
        for d in data.iter_mut().flatten() {
            (d.4, d.5) = (None, None);
        }
        data
    }

    fn entries(v: &[Option<Owned>]) -> Vec<Entry<'_>> {
        v.iter()
            .map(|e| match e {
                Some((id, tx, p, t, h, d)) => Entry::Message(Frame {
                    message_id: *id,
                    transaction_id: tx,
                    payload: p,
                    created_at: Some(*t),
                    headers: h.as_deref(),
                    deliver_at: *d,
                }),
                None => Entry::Gap,
            })
            .collect()
    }

    fn own(e: Entry<'_>) -> Option<Owned> {
        match e {
            Entry::Message(f) => Some((
                f.message_id,
                f.transaction_id.to_string(),
                f.payload.to_vec(),
                f.created_at.unwrap(),
                f.headers.map(<[u8]>::to_vec),
                f.deliver_at,
            )),
            Entry::Gap => None,
        }
    }

    fn decode_all(bytes: &[u8]) -> Result<Vec<Option<Owned>>, CodecError> {
        let seg = Segment::parse(bytes)?;
        let mut out = Vec::new();
        seg.for_each_in(0, usize::MAX, |_, e| out.push(own(e)))?;
        Ok(out)
    }

    /// The version 1 encoder, as queen 0.2.0 wrote segments: they must still decode.
    fn encode_v1(frames: &[([u8; 16], &str, &[u8])]) -> Vec<u8> {
        let mut raw = Vec::new();
        for (id, tx, p) in frames {
            raw.extend_from_slice(id);
            put_varint(&mut raw, tx.len() as u64);
            raw.extend_from_slice(tx.as_bytes());
            put_varint(&mut raw, p.len() as u64);
            raw.extend_from_slice(p);
        }
        let mut out = b"QS\x01".to_vec();
        put_varint(&mut out, frames.len() as u64);
        put_varint(&mut out, 1);
        put_varint(&mut out, frames.len() as u64);
        put_varint(&mut out, raw.len() as u64);
        put_varint(&mut out, raw.len() as u64);
        out.push(CODEC_RAW);
        out.extend_from_slice(&crc32fast::hash(&raw).to_le_bytes());
        out.extend_from_slice(&raw);
        out
    }

    /// Reads every entry of `bytes` through its directory, at `place`.
    fn read_at(bytes: &[u8], place: Option<Place>) -> Result<Vec<Option<Owned>>, CodecError> {
        let dir = Directory::parse(bytes, bytes.len())?;
        let mut out = Vec::new();
        dir.for_each_in_at(place, bytes, 0, 0, usize::MAX, |_, e| out.push(own(e)))?;
        Ok(out)
    }

    #[test]
    fn a_block_read_at_a_place_is_decompressed_once() {
        let data = owned(100, 80);
        let mut bytes = encode(entries(&data));
        let place = Place { partition: [7; 16], first: 1_000, last: 1_099 };
        assert_eq!(read_at(&bytes, Some(place)).unwrap(), data);
        // Damage every compressed body byte after the header: a read at the same place
        // comes from the cache; a read anywhere else (or at no place) finds the damage.
        let dir = Directory::parse(&bytes, bytes.len()).unwrap();
        assert!(dir.blocks.iter().all(|b| b.codec == CODEC_ZSTD), "the test needs compressed blocks");
        let body_start = dir.blocks[0].body_start;
        for b in &mut bytes[body_start..] {
            *b ^= 0x5a;
        }
        assert_eq!(read_at(&bytes, Some(place)).unwrap(), data);
        assert!(read_at(&bytes, None).is_err());
        assert!(read_at(&bytes, Some(Place { first: 2_000, last: 2_099, ..place })).is_err());
        assert!(read_at(&bytes, Some(Place { partition: [8; 16], ..place })).is_err());
        // After an abort nothing is served from the cache.
        forget_blocks();
        assert!(read_at(&bytes, Some(place)).is_err());
    }

    #[test]
    fn the_block_cache_stays_bounded() {
        let mut cache = BlockCache::new();
        for i in 0..(CACHE_BLOCKS as i64 * 3) {
            let key = BlockKey {
                place: Place { partition: [1; 16], first: i, last: i },
                version: VERSION,
                first_index: 0,
                crc: 0,
                raw_len: 40_000,
            };
            cache.put(key, std::rc::Rc::new(vec![0; 40_000]));
            assert!(cache.entries.len() <= CACHE_BLOCKS && cache.bytes <= CACHE_BYTES);
            assert!(cache.get(&key).is_some(), "the newest block is kept");
        }
        let huge = BlockKey {
            place: Place { partition: [2; 16], first: 0, last: 0 },
            version: VERSION,
            first_index: 0,
            crc: 0,
            raw_len: CACHE_BYTES,
        };
        cache.put(huge, std::rc::Rc::new(vec![0; CACHE_BYTES]));
        assert!(cache.get(&huge).is_none() && cache.bytes <= CACHE_BYTES);
    }

    #[test]
    fn round_trip_many_blocks() {
        let data = owned(1000, 200);
        let bytes = encode(entries(&data));
        let seg = Segment::parse(&bytes).unwrap();
        assert_eq!(seg.frame_count(), 1000);
        assert!(seg.dir.blocks.len() > 1, "1000 frames span several blocks");
        assert_eq!(decode_all(&bytes).unwrap(), data);
        // compressed well below the raw size
        let raw: usize = data.iter().flatten().map(|(_, t, p, _, _, _)| 16 + t.len() + p.len()).sum();
        assert!(bytes.len() < raw / 3, "{} vs {}", bytes.len(), raw);
    }

    #[test]
    fn gaps_keep_their_offsets() {
        let mut data = owned(200, 20);
        for i in [0, 5, 6, 64, 65, 199] {
            data[i] = None;
        }
        let bytes = encode(entries(&data));
        assert_eq!(decode_all(&bytes).unwrap(), data);
        let seg = Segment::parse(&bytes).unwrap();
        let mut seen = Vec::new();
        seg.for_each_in(4, 8, |i, e| seen.push((i, e == Entry::Gap))).unwrap();
        assert_eq!(seen, vec![(4, false), (5, true), (6, true), (7, false)]);
    }

    #[test]
    fn version_1_segments_still_decode() {
        let bytes = encode_v1(&[([1u8; 16], "a", b"{\"x\": 1}"), ([2u8; 16], "b", b"[]")]);
        let seg = Segment::parse(&bytes).unwrap();
        let mut got = Vec::new();
        seg.for_each_in(0, 9, |i, e| match e {
            Entry::Message(f) => {
                got.push((i, f.message_id[0], f.transaction_id.to_string(), f.payload.to_vec(), f.created_at))
            }
            Entry::Gap => panic!("a version 1 segment has no gaps"),
        })
        .unwrap();
        assert_eq!(
            got,
            vec![(0, 1, "a".into(), b"{\"x\": 1}".to_vec(), None), (1, 2, "b".into(), b"[]".to_vec(), None)]
        );
    }

    #[test]
    fn blocks_and_chunks_walk_a_span_block_by_block() {
        // 64-frame blocks, then big payloads: the first closes the block it joins (it passes
        // BLOCK_BYTES), the others are a block each.
        let mut data = owned(150, 10);
        data.extend(owned(3, 40_000));
        let bytes = encode_uncompressed(entries(&data));
        let dir = Directory::parse(&bytes, bytes.len()).unwrap();
        let all: Vec<BlockSpan> = dir.blocks(0, usize::MAX).collect();
        assert_eq!(all.iter().map(|b| b.frames).collect::<Vec<_>>(), vec![64, 64, 23, 1, 1]);
        assert_eq!(all[0].first_index, 0);
        assert_eq!(all.last().unwrap().end, bytes.len());
        for w in all.windows(2) {
            assert_eq!((w[0].end, w[0].first_index + w[0].frames), (w[1].start, w[1].first_index));
        }
        // Only the blocks that hold the frames asked for; none for an empty span.
        assert_eq!(dir.blocks(63, 65).collect::<Vec<_>>(), all[0..2]);
        assert_eq!(dir.blocks(64, 128).collect::<Vec<_>>(), all[1..2]);
        assert_eq!(dir.blocks(151, 10_000).collect::<Vec<_>>(), all[3..]);
        assert_eq!(dir.blocks(5, 5).count(), 0);
        assert_eq!(dir.blocks(153, 200).count(), 0);
        assert_eq!(dir.span(63, 65), Some((all[0].start, all[1].end)));
        // A chunk holds the blocks that fit the limit, at least one.
        let c = dir.chunk(10, 153, 0).unwrap();
        assert_eq!(c, Chunk { from: 10, to: 64, start: all[0].start, end: all[0].end });
        let c = dir.chunk(10, 153, all[2].end - all[0].start).unwrap();
        assert_eq!(c, Chunk { from: 10, to: 151, start: all[0].start, end: all[2].end });
        let c = dir.chunk(150, 152, usize::MAX).unwrap();
        assert_eq!(c, Chunk { from: 150, to: 152, start: all[2].start, end: all[3].end });
        let c = dir.chunk(151, 153, 1).unwrap();
        assert_eq!(c, Chunk { from: 151, to: 152, start: all[3].start, end: all[3].end });
        assert!(c.end - c.start > 40_000, "a block larger than the limit comes whole");
        assert_eq!(dir.chunk(153, 160, usize::MAX), None);
        assert_eq!(dir.chunk(7, 7, usize::MAX), None);
    }

    #[test]
    fn range_decodes_only_requested_frames() {
        let data = owned(300, 10);
        let bytes = encode(entries(&data));
        let seg = Segment::parse(&bytes).unwrap();
        let mut seen = Vec::new();
        seg.for_each_in(70, 75, |i, e| {
            assert_eq!(own(e), data[i]);
            seen.push(i)
        })
        .unwrap();
        assert_eq!(seen, vec![70, 71, 72, 73, 74]);
        let mut none = 0;
        seg.for_each_in(300, 400, |_, _| none += 1).unwrap();
        seg.for_each_in(5, 5, |_, _| none += 1).unwrap();
        assert_eq!(none, 0);
    }

    #[test]
    fn single_big_and_unicode_payloads() {
        let big = vec![b'a'; 1 << 20];
        let uni = "{\"t\": \"żółć 日本語 🚀\"}".as_bytes().to_vec();
        let data = vec![
            Some(([1u8; 16], "a".to_string(), big, 5, None, None)),
            Some(([2u8; 16], "é".to_string(), uni, -7, None, None)),
        ];
        assert_eq!(decode_all(&encode(entries(&data))).unwrap(), data);
    }

    #[test]
    fn uncompressed_segments_decode_the_same() {
        let data = owned(300, 50);
        let raw = encode_uncompressed(entries(&data));
        let packed = encode(entries(&data));
        assert!(packed.len() < raw.len() / 2);
        assert!(Segment::parse(&raw).unwrap().dir.blocks.iter().all(|b| b.codec == CODEC_RAW));
        assert_eq!(decode_all(&raw).unwrap(), data);
    }

    #[test]
    fn small_and_incompressible_blocks_stay_raw() {
        let data = vec![Some(([7u8; 16], String::new(), b"{}".to_vec(), 0, None, None))];
        let bytes = encode(entries(&data));
        let seg = Segment::parse(&bytes).unwrap();
        assert_eq!(seg.dir.blocks[0].codec, CODEC_RAW);
        assert_eq!(decode_all(&bytes).unwrap(), data);
    }

    #[test]
    fn corrupt_inputs_are_errors() {
        assert_eq!(Segment::parse(b"").unwrap_err(), CodecError::Truncated("magic"));
        assert_eq!(Segment::parse(b"XX\x01\x00\x00").unwrap_err(), CodecError::BadMagic);
        assert_eq!(Segment::parse(b"QS\x09\x00\x00").unwrap_err(), CodecError::UnsupportedVersion(9));
        let bytes = encode(entries(&owned(200, 50)));
        for cut in [3, 5, 10, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode_all(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert_eq!(decode_all(&extra).unwrap_err(), CodecError::TrailingBytes);
        // An entry kind this version does not know is an error, never a misread.
        let mut raw = vec![9u8];
        raw.extend_from_slice(&[0; 20]);
        assert_eq!(decode_all(&raw_segment(VERSION, &raw)).unwrap_err(), CodecError::UnknownKind(9));
    }

    /// A segment of version `version` (2 or 3, base time 0) holding one raw block of one
    /// entry, `raw`, built by hand.
    fn raw_segment(version: u8, raw: &[u8]) -> Vec<u8> {
        let mut seg = MAGIC.to_vec();
        seg.extend_from_slice(&[version, 0x00, 0x01, 0x01, 0x01]);
        put_varint(&mut seg, raw.len() as u64);
        put_varint(&mut seg, raw.len() as u64);
        seg.push(CODEC_RAW);
        seg.extend_from_slice(&block_crc(version, 0, raw).to_le_bytes());
        seg.extend_from_slice(raw);
        seg
    }

    #[test]
    fn a_transaction_id_that_is_the_message_id_is_not_stored() {
        let mut data = plain_owned(10, 20);
        let plain = encode_uncompressed(entries(&data));
        assert_eq!(plain[2], VERSION);
        // Every message's transaction id becomes its message id's text: 36 bytes each
        // left out, one flags byte each added, and version 3.
        let stored: usize = data.iter().flatten().map(|d| d.1.len()).sum();
        for d in data.iter_mut().flatten() {
            d.1 = crate::ids::uuid_string(&d.0);
        }
        let derived = encode_uncompressed(entries(&data));
        assert_eq!(derived[2], VERSION_3);
        assert_eq!(derived.len(), plain.len() - stored + data.len(), "no transaction id bytes, a flags byte each");
        assert_eq!(decode_all(&derived).unwrap(), data);
        // Upper case is another string: stored as it is, and given back as it is. (This
        // message's id has letters in its text; the first ids of `owned` are all digits.)
        let d3 = data[3].as_mut().unwrap();
        d3.0 = [0xab; 16];
        d3.1 = crate::ids::uuid_string(&d3.0).to_uppercase();
        let mixed = encode_uncompressed(entries(&data));
        assert_eq!(mixed.len(), derived.len() + 36 - 1, "36 bytes stored, no flags byte");
        assert_eq!(decode_all(&mixed).unwrap(), data);
        // A frame that has the flag and stores a transaction id too is refused.
        let frame = |flags: u8, tx: &[u8]| {
            let mut raw = vec![KIND_EXTENDED];
            raw.extend_from_slice(&[7; 16]);
            put_varint(&mut raw, 0);
            put_varint(&mut raw, tx.len() as u64);
            raw.extend_from_slice(tx);
            put_varint(&mut raw, 2);
            raw.extend_from_slice(b"{}");
            raw.push(flags);
            raw_segment(VERSION_3, &raw)
        };
        assert_eq!(decode_all(&frame(TX_FROM_ID, b"x")).unwrap_err(), CodecError::TxStoredAndDerived);
        let ok = decode_all(&frame(TX_FROM_ID, b"")).unwrap();
        assert_eq!(ok[0].as_ref().unwrap().1, crate::ids::uuid_string(&[7; 16]));
        assert_eq!(decode_all(&frame(8, b"")).unwrap_err(), CodecError::UnknownFlags(8));
    }

    #[test]
    fn extensions_make_a_version_3_segment_and_only_then() {
        let mut data = plain_owned(10, 20);
        let plain = encode(entries(&data));
        assert_eq!(plain[2], VERSION, "no headers or delivery time: the version 2 bytes, as before");
        data[4].as_mut().unwrap().4 = Some(b"{\"traceparent\": \"00-ab-cd-01\"}".to_vec());
        data[6].as_mut().unwrap().4 = Some(Vec::new());
        let with = encode(entries(&data));
        assert_eq!(with[2], VERSION_3);
        assert_eq!(decode_all(&with).unwrap(), data, "an empty header block is kept, not dropped");
        data[8].as_mut().unwrap().5 = Some(i64::MIN);
        data[4].as_mut().unwrap().5 = Some(i64::MAX);
        let both = encode(entries(&data));
        assert_eq!(decode_all(&both).unwrap(), data, "any delivery time, headers or not");
        // A version 2 segment may not carry the extended kind: refused, never misread.
        let mut downgraded = with.clone();
        downgraded[2] = VERSION;
        assert!(decode_all(&downgraded).is_err());
    }

    #[test]
    fn unknown_flags_are_errors() {
        let frame = Frame {
            message_id: [1; 16],
            transaction_id: "t",
            payload: b"{}",
            created_at: Some(0),
            headers: None,
            deliver_at: Some(5),
        };
        let good = encode_uncompressed([Entry::Message(frame)]);
        assert!(decode_all(&good).is_ok());
        // The flags byte follows the payload (kind, id, time, txid, payload): set a bit
        // this code does not know, and fix the block's checksum so only the flag is wrong.
        let dir = Directory::parse(&good, good.len()).unwrap();
        let body = dir.blocks[0].body_start;
        let mut raw = good[body..].to_vec();
        let flags_at = 1 + 16 + 1 + 1 + 1 + 1 + 2;
        assert_eq!(raw[flags_at], HAS_DELIVER_AT);
        raw[flags_at] |= 0x80;
        let mut bad = good[..body].to_vec();
        let crc_at = body - 4;
        bad[crc_at..].copy_from_slice(&block_crc(VERSION_3, 0, &raw).to_le_bytes());
        bad.extend_from_slice(&raw);
        assert_eq!(decode_all(&bad).unwrap_err(), CodecError::UnknownFlags(0x82));
    }

    /// The encoder as it was before `Encoder` (every block built, then compressed): the
    /// streaming encoder must write exactly its bytes. It writes each frame with
    /// `put_frame`, as `Encoder` does, so it checks the blocks, the version and the
    /// checksums, not the frame layout (the hand-built segments of the tests above do).
    fn reference_encode<'a, I>(entries: I, compress: bool) -> Vec<u8>
    where
        I: IntoIterator<Item = Entry<'a>>,
    {
        struct Block {
            entries: usize,
            raw: Vec<u8>,
        }
        let mut blocks: Vec<Block> = Vec::new();
        let mut current = Block { entries: 0, raw: Vec::new() };
        let mut count: u64 = 0;
        let mut base: Option<i64> = None;
        let mut version = VERSION;
        for entry in entries {
            match entry {
                Entry::Gap => current.raw.push(KIND_GAP),
                Entry::Message(frame) => {
                    let base = *base.get_or_insert(frame.created_at.unwrap_or(0));
                    let flags = frame.flags();
                    if flags != 0 {
                        version = VERSION_3;
                    }
                    put_frame(&mut current.raw, &frame, flags, base);
                }
            }
            current.entries += 1;
            count += 1;
            if current.entries >= BLOCK_FRAMES || current.raw.len() >= BLOCK_BYTES {
                blocks.push(std::mem::replace(&mut current, Block { entries: 0, raw: Vec::new() }));
            }
        }
        if current.entries > 0 {
            blocks.push(current);
        }

        let mut header = Vec::with_capacity(24 + blocks.len() * 8);
        header.extend_from_slice(MAGIC);
        header.push(version);
        put_varint(&mut header, zigzag(base.unwrap_or(0)));
        put_varint(&mut header, count);
        put_varint(&mut header, blocks.len() as u64);
        let mut bodies: Vec<Vec<u8>> = Vec::with_capacity(blocks.len());
        for block in blocks {
            // A block too small to gain anything stays raw without asking zstd.
            let compressed = (compress && block.raw.len() >= MIN_COMPRESS).then(|| {
                COMPRESSOR.with(|c| {
                    let mut c = c.borrow_mut();
                    let c = c.get_or_insert_with(|| zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd context"));
                    c.compress(&block.raw).ok()
                })
            });
            let crc = block_crc(version, base.unwrap_or(0), &block.raw).to_le_bytes();
            let raw_len = block.raw.len();
            let (codec, body) = match compressed.flatten() {
                Some(c) if c.len() < raw_len => (CODEC_ZSTD, c),
                _ => (CODEC_RAW, block.raw),
            };
            put_varint(&mut header, block.entries as u64);
            put_varint(&mut header, raw_len as u64);
            put_varint(&mut header, body.len() as u64);
            header.push(codec);
            header.extend_from_slice(&crc);
            bodies.push(body);
        }
        let total: usize = header.len() + bodies.iter().map(Vec::len).sum::<usize>();
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&header);
        for body in bodies {
            out.extend_from_slice(&body);
        }
        out
    }

    /// Entries that make the streaming encoder's hard cases likely: a run of gaps first
    /// (blocks closed before the base time is known), compressible and big payloads
    /// (zstd blocks, blocks of one frame), and headers or a delivery time appearing late
    /// (the version switching to 3 after blocks closed).
    fn streaming_entries() -> impl Strategy<Value = Vec<Option<Owned>>> {
        let payload = prop_oneof![
            3 => proptest::collection::vec(any::<u8>(), 0..300),
            4 => (any::<u8>(), 0usize..3000).prop_map(|(b, n)| vec![b; n]),
            1 => (any::<u8>(), 30_000usize..70_000).prop_map(|(b, n)| vec![b; n]),
        ];
        let message = (
            id_and_tx(),
            payload,
            -1_000_000i64..1_000_000,
            proptest::option::weighted(0.01, proptest::collection::vec(any::<u8>(), 0..100)),
            proptest::option::weighted(0.01, any::<i64>()),
        )
            .prop_map(|((id, tx), p, t, h, d)| (id, tx, p, t, h, d));
        (0usize..200, proptest::collection::vec(proptest::option::weighted(0.8, message), 0..250)).prop_map(
            |(gaps, rest)| {
                let mut v: Vec<Option<Owned>> = vec![None; gaps];
                v.extend(rest);
                v
            },
        )
    }

    /// A message id and a transaction id: any text, the message id's own text (derived,
    /// not stored: `TX_FROM_ID`), or texts that are close to it but not it (upper case, one
    /// character changed, cut short), which must be stored as they are.
    fn id_and_tx() -> impl Strategy<Value = ([u8; 16], String)> {
        (any::<[u8; 16]>(), 0u8..6, "[a-z0-9-]{0,40}", 0usize..36).prop_map(|(id, k, any, at)| {
            let own = crate::ids::uuid_string(&id);
            let tx = match k {
                0 | 1 => own,
                2 => own.to_uppercase(),
                3 => {
                    let mut b = own.into_bytes();
                    b[at] = if b[at] == b'0' { b'1' } else { b'0' };
                    String::from_utf8(b).unwrap()
                }
                4 => own[..at].to_string(),
                _ => any,
            };
            (id, tx)
        })
    }

    fn any_entries() -> impl Strategy<Value = Vec<Option<Owned>>> {
        proptest::collection::vec(
            proptest::option::weighted(
                0.85,
                (
                    id_and_tx(),
                    proptest::collection::vec(any::<u8>(), 0..600),
                    any::<i64>(),
                    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..100)),
                    proptest::option::of(any::<i64>()),
                )
                    .prop_map(|((id, tx), p, t, h, d)| (id, tx, p, t, h, d)),
            ),
            1..300,
        )
    }

    #[test]
    fn the_streaming_encoder_fixes_checksums_of_closed_blocks() {
        // 100 gaps (a block closed before the base time is known), then compressible
        // messages (zstd blocks), then one with headers (version 3 after all that).
        let mut items: Vec<Option<Owned>> = vec![None; 100];
        for (i, m) in owned(200, 1000).into_iter().enumerate() {
            let (id, tx, p, t, _, _) = m.unwrap();
            items.push(Some((id, tx, p, t + i as i64, None, None)));
        }
        let mut late = owned(1, 10).pop().unwrap().unwrap();
        late.4 = Some(b"{\"k\": 1}".to_vec());
        items.push(Some(late));
        items.extend(owned(30, 500));
        for compress in [true, false] {
            let reference = reference_encode(entries(&items), compress);
            let mut encoder = Encoder::new(compress);
            for e in entries(&items) {
                encoder.push(e);
            }
            assert_eq!(encoder.len(), items.len() as u64);
            let streamed = encoder.finish();
            assert!(streamed == reference, "compress {compress}");
            let dir = Directory::parse(&streamed, streamed.len()).unwrap();
            assert_eq!(dir.version, VERSION_3);
            assert_eq!(dir.blocks[0].frames, BLOCK_FRAMES, "the gaps' block");
            assert_eq!(compress, dir.blocks.iter().filter(|b| b.codec == CODEC_ZSTD).count() > 2);
            assert_eq!(decode_all(&streamed).unwrap(), items);
        }
        // Gaps only: the base time stays 0.
        let gaps: Vec<Option<Owned>> = vec![None; 150];
        assert!(encode(entries(&gaps)) == reference_encode(entries(&gaps), true));
        assert_eq!(decode_all(&encode(entries(&gaps))).unwrap(), gaps);
        assert!(Encoder::new(true).finish() == reference_encode(std::iter::empty(), true));
    }

    #[test]
    fn checksums_are_recomputed_from_stored_bodies() {
        // Closed blocks of both codecs; then as if the base time changed: each block's
        // checksum is that of its raw bytes under the new base.
        let mut encoder = Encoder::new(true);
        let items = owned(300, 400);
        for e in entries(&items) {
            encoder.push(e);
        }
        encoder.push(Entry::Gap);
        let closed = encoder.closed.len();
        assert!(closed > 2 && encoder.closed.iter().any(|b| b.codec == CODEC_ZSTD));
        let before: Vec<u32> = encoder.closed.iter().map(|b| b.crc).collect();
        encoder.base = Some(encoder.base.unwrap() + 1);
        encoder.recompute_crcs();
        let mut at = 0;
        for (block, old) in encoder.closed.iter().zip(before) {
            let body = &encoder.bodies[at..at + block.stored_len];
            at += block.stored_len;
            let raw = match block.codec {
                CODEC_ZSTD => zstd::bulk::decompress(body, block.raw_len).unwrap(),
                _ => body.to_vec(),
            };
            assert_eq!(block.crc, block_crc(encoder.version, encoder.base.unwrap(), &raw));
            assert_ne!(block.crc, old);
        }
        assert_eq!(crc_salt(VERSION, 5), crc_salt(VERSION_3, 5), "version 3 keeps version 2's checksums");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// `Encoder` writes exactly the bytes of the encoder it replaced, compressed or not.
        #[test]
        fn prop_streaming_encoder_matches_the_reference(items in streaming_entries()) {
            for compress in [true, false] {
                let streamed = if compress { encode(entries(&items)) } else { encode_uncompressed(entries(&items)) };
                let reference = reference_encode(entries(&items), compress);
                prop_assert!(streamed == reference, "compress {}: {} vs {} bytes", compress, streamed.len(), reference.len());
            }
            prop_assert_eq!(decode_all(&encode(entries(&items))).unwrap(), items);
        }
    }

    proptest! {
        #[test]
        fn prop_round_trip(items in any_entries()) {
            let bytes = encode(entries(&items));
            prop_assert_eq!(decode_all(&bytes).unwrap(), items.clone());
            let n = items.len();
            let (a, b) = (n / 3, n - n / 4);
            let seg = Segment::parse(&bytes).unwrap();
            let mut got = Vec::new();
            seg.for_each_in(a, b, |i, e| got.push((i, own(e)))).unwrap();
            prop_assert_eq!(got.len(), b.saturating_sub(a));
            for (i, e) in got { prop_assert_eq!(&e, &items[i]); }
        }

        /// Reading through a directory parsed from a prefix, with only the span's bytes,
        /// gives exactly the entries a whole-segment read gives; a prefix that ends inside
        /// the header is `Truncated`, never a wrong directory.
        #[test]
        fn prop_span_read_matches_whole_read(n in 1usize..400, size in 0usize..200, a in any::<usize>(), b in any::<usize>(), cut in any::<usize>(), gaps in any::<u64>()) {
            let mut data = owned(n, size);
            for (i, d) in data.iter_mut().enumerate() {
                if gaps >> (i % 64) & 1 == 1 && i % 3 == 0 {
                    *d = None;
                }
            }
            let bytes = encode(entries(&data));
            let (from, to) = { let (x, y) = (a % (n + 1), b % (n + 1)); (x.min(y), x.max(y)) };
            let whole = Segment::parse(&bytes).unwrap();
            let mut want = Vec::new();
            whole.for_each_in(from, to, |i, e| want.push((i, own(e)))).unwrap();
            let mut k = 3;
            let dir = loop {
                match Directory::parse(&bytes[..k], bytes.len()) {
                    Ok(d) => break d,
                    Err(CodecError::Truncated(_)) if k < bytes.len() => k += 1,
                    Err(e) => panic!("prefix of {k}: {e}"),
                }
            };
            let cut = cut % k;
            let short = Directory::parse(&bytes[..cut], bytes.len());
            let refused = matches!(short, Err(CodecError::Truncated(_)));
            prop_assert!(refused, "a prefix of {} bytes inside the header gave {:?}", cut, short);
            let mut got = Vec::new();
            if let Some((s, e)) = dir.span(from, to) {
                dir.for_each_in(&bytes[s..e], s, from, to, |i, e| got.push((i, own(e)))).unwrap();
                // One byte short of the span is an error, not fewer frames.
                let short = dir.for_each_in(&bytes[s..e - 1], s, from, to, |_, _| ());
                prop_assert!(short.is_err());
            }
            prop_assert_eq!(got, want);
        }

        /// Reading a span chunk by chunk (`chunk`), each with only its own bytes, gives
        /// exactly the entries one read of the span gives; every chunk is at most `limit`
        /// bytes unless it is one block, and stops only where the next block would pass it.
        #[test]
        fn prop_chunked_read_matches_span_read(n in 1usize..400, size in 0usize..3000, a in any::<usize>(), b in any::<usize>(), limit in 0usize..100_000, raw in any::<bool>()) {
            let data = owned(n, size);
            let bytes = if raw { encode_uncompressed(entries(&data)) } else { encode(entries(&data)) };
            let (from, to) = { let (x, y) = (a % (n + 1), b % (n + 1)); (x.min(y), x.max(y)) };
            let dir = Directory::parse(&bytes, bytes.len()).unwrap();
            let mut want = Vec::new();
            dir.for_each_in(&bytes, 0, from, to, |i, e| want.push((i, own(e)))).unwrap();
            let mut got = Vec::new();
            let mut at = from;
            let mut fetched = 0;
            while let Some(c) = dir.chunk(at, to, limit) {
                prop_assert_eq!(c.from, at);
                prop_assert!(c.from < c.to && c.to <= to);
                let blocks: Vec<BlockSpan> = dir.blocks(c.from, c.to).collect();
                prop_assert_eq!((blocks[0].start, blocks.last().unwrap().end), (c.start, c.end));
                prop_assert!(c.end - c.start <= limit || blocks.len() == 1);
                if let Some(next) = dir.blocks(c.to, to).next() {
                    prop_assert!(next.end - c.start > limit, "the next block would fit the limit");
                }
                let place = Some(Place { partition: [9; 16], first: 0, last: n as i64 - 1 });
                dir.for_each_in_at(place, &bytes[c.start..c.end], c.start, c.from, c.to, |i, e| got.push((i, own(e)))).unwrap();
                fetched += c.end - c.start;
                at = c.to;
            }
            prop_assert_eq!(at, if want.is_empty() { from } else { to });
            prop_assert_eq!(fetched, dir.span(from, to).map_or(0, |(s, e)| e - s), "each block fetched once");
            prop_assert_eq!(got, want);
        }

        /// Every strict prefix of a segment is an error, never fewer frames.
        #[test]
        fn prop_truncation_is_an_error(n in 1usize..200, size in 0usize..300, cut in any::<usize>()) {
            let data = owned(n, size);
            let bytes = encode(entries(&data));
            let cut = cut % bytes.len();
            prop_assert!(decode_all(&bytes[..cut]).is_err(), "prefix of {} of {} bytes decoded", cut, bytes.len());
        }

        /// Arbitrary bytes and bit flips never panic: they decode to an error or to frames.
        #[test]
        fn prop_garbage_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 0..2000),
                                     flip in any::<usize>()) {
            let _ = decode_all(&bytes);
            let data = owned(100, 20);
            let good = encode(entries(&data));
            let mut bad = good.clone();
            let i = flip % bad.len();
            bad[i] ^= 0x5a;
            // A flipped byte is an error (CRC or structure), or a byte that did not matter
            // (a zstd header bit, say): never a wrong payload.
            match decode_all(&bad) {
                Err(_) => {}
                Ok(decoded) => prop_assert_eq!(decoded, data),
            }
            bytes.extend_from_slice(&good);
            let _ = decode_all(&bytes);
        }
    }
}
