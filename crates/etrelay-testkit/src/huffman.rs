//! The Quake 3 engines' adaptive Huffman codec, as used on the one compressed connectionless
//! packet: a client's `connect`.
//!
//! A deliberately literal, readable model (a reference oracle, like [`crate::q3model`]), written
//! from the facts of `code/qcommon/huffman.c` (ioquake3; ET 2.60b and ET: Legacy carry the same
//! file), not for speed:
//!
//! * where it is used: the client sends `FF FF FF FF connect "<userinfo>"` through
//!   `NET_OutOfBandData`, which runs `Huff_Compress(msg, 12)`: everything from offset 12 (the
//!   `"` that opens the userinfo) is replaced by a compressed **block**. The server runs
//!   `Huff_Decompress(msg, 12)` on every connectionless packet whose bytes 4..11 are exactly
//!   `connect` (`Q_strncmp`, case-sensitive), then reads it as text;
//! * the block: the uncompressed length as 2 bytes, big-endian, then the bitstream, bits
//!   written least significant bit first within each byte;
//! * the code is adaptive (Sayood's adaptive Huffman, the FGK family): both sides start from a
//!   tree holding only the NYT ("not yet transmitted") node and update it identically after
//!   every symbol. A symbol already seen is sent as its path from the root (`0` = left,
//!   `1` = right); a new one as the NYT node's path, then its 8 bits, most significant first;
//! * the update ("increment"): nodes are ranked by a doubly linked list (lowest weight first,
//!   the NYT node at its start); the nodes of equal weight form a block whose highest-ranked
//!   member, the block leader, is kept in a cell shared by the whole block. Before a node's
//!   weight grows it trades places (in the tree, unless the leader is its parent, and in the
//!   list) with its block's leader; then it leaves that block, grows, joins the block above if
//!   the next node has its new weight (else founds a block of its own), and its parent is
//!   incremented in turn; a parent that ended up ranked just below its child trades list
//!   places with it;
//! * a new symbol: a new internal node (weight 1) takes the NYT node's place in the tree, with
//!   the NYT node as its left child and the new leaf (weight 1) as its right; both enter the
//!   list right above the NYT node (the leaf lowest), and the new node's parent is incremented.
//!
//! Engine quirks kept, because they are what goes on the wire:
//!
//! * the tree swap rewires the first node's parent slot, then looks the second node up in its
//!   (possibly just rewired) parent: for two siblings it swaps them only when the first is the
//!   right child;
//! * `Huff_Compress` gives the bit writer a limit of `8 × length` bits, counted from the start
//!   of the block (length bytes included), checked only before each bit of a *path*: past it a
//!   path is skipped and the write position set to `limit + 1`, and the literal bits that follow
//!   are OR-ed over what was written there. Data that does not compress (random bytes) comes
//!   out garbled; [`try_compress`] says when. Real userinfo text always fits;
//! * the written length is `(bit position + 8) / 8` bytes: when the bits end on a byte boundary
//!   one more byte follows (stale stack memory in the engine, 0 here);
//! * `Huff_Decompress` caps the announced length at the message buffer's room, and stops early
//!   (leaving a NUL) only when, before a symbol, the bit position is more than one byte past the
//!   block; a symbol may still read past the end (stale buffer memory in the engine, 0 here).
//!   [`decompress_as_engine`] models this; [`decompress`] is the strict reading.
//!
//! Checked against the C code: a harness of our own (outside this repository) compiled
//! `huffman.c` unchanged but for zero-filled buffers, and the model agreed with it on every
//! compressed block and every decompressed output of tens of thousands of random inputs
//! (random bytes, text, skewed and repetitive data, garbage blocks); a few of those vectors are
//! pinned in the tests below.

/// Largest output [`decompress`] accepts (ioquake3's `MAX_MSGLEN`); larger announced lengths
/// are refused.
pub const MAX_DECOMPRESSED: usize = 16_384;

/// The offset from which a `connect` packet is compressed: `FF FF FF FF connect ` is 12 bytes.
pub const CONNECT_OFFSET: usize = 12;

/// Symbol of the NYT node (`HMAX`).
const NYT: u16 = 256;
/// Symbol of an internal node (`INTERNAL_NODE`).
const INTERNAL: u16 = 257;

/// Index of a node in [`Tree::nodes`].
type NodeId = usize;
/// Index of a block-leader cell in [`Tree::cells`].
type CellId = usize;

/// One node of the tree, also a member of the rank list.
#[derive(Debug, Clone)]
struct Node {
    /// A byte (0..=255), [`NYT`] or [`INTERNAL`].
    symbol: u16,
    /// How many times the subtree's symbols were seen.
    weight: u32,
    parent: Option<NodeId>,
    left: Option<NodeId>,
    right: Option<NodeId>,
    /// The node ranked just above (towards the root).
    next: Option<NodeId>,
    /// The node ranked just below (towards the NYT node).
    prev: Option<NodeId>,
    /// The cell naming this node's block leader (shared by the block); none for the NYT node.
    head: Option<CellId>,
}

impl Node {
    fn new(symbol: u16, weight: u32) -> Node {
        Node {
            symbol,
            weight,
            parent: None,
            left: None,
            right: None,
            next: None,
            prev: None,
            head: None,
        }
    }
}

/// The adaptive tree, its rank list and its block-leader cells (`huff_t`).
#[derive(Debug)]
struct Tree {
    nodes: Vec<Node>,
    /// Block-leader cells (`nodePtrs`); a free cell holds `None`.
    cells: Vec<Option<NodeId>>,
    /// Cells given back, reused last-in first-out (`freelist`).
    free_cells: Vec<CellId>,
    root: NodeId,
    /// The NYT node: also the start of the rank list (`lhead`).
    nyt: NodeId,
    /// The leaf of each byte seen so far (`loc`).
    leaf_of: [Option<NodeId>; 256],
}

impl Tree {
    /// A tree of the NYT node alone.
    fn new() -> Tree {
        Tree {
            nodes: vec![Node::new(NYT, 0)],
            cells: Vec::new(),
            free_cells: Vec::new(),
            root: 0,
            nyt: 0,
            leaf_of: [None; 256],
        }
    }

    /// A cell naming `leader` (`get_ppnode`).
    fn take_cell(&mut self, leader: NodeId) -> CellId {
        match self.free_cells.pop() {
            Some(cell) => {
                self.cells[cell] = Some(leader);
                cell
            }
            None => {
                self.cells.push(Some(leader));
                self.cells.len() - 1
            }
        }
    }

    /// The cell of `node`'s block.
    fn cell(&self, node: NodeId) -> CellId {
        self.nodes[node]
            .head
            .expect("invariant: every node but the NYT node belongs to a block")
    }

    /// The leader of `node`'s block.
    fn leader(&self, node: NodeId) -> Option<NodeId> {
        self.cells[self.cell(node)]
    }

    /// Is the node ranked just above `node` of weight `weight`?
    fn next_weighs(&self, node: NodeId, weight: u32) -> bool {
        self.nodes[node]
            .next
            .is_some_and(|n| self.nodes[n].weight == weight)
    }

    /// Makes the slot holding `old` (its parent's left or right, or the root) hold `new`: the
    /// left slot if it holds `old`, else the right one.
    fn replace_child(&mut self, parent: Option<NodeId>, old: NodeId, new: NodeId) {
        match parent {
            Some(p) if self.nodes[p].left == Some(old) => self.nodes[p].left = Some(new),
            Some(p) => self.nodes[p].right = Some(new),
            None => self.root = new,
        }
    }

    /// Swaps two nodes' places in the tree (`swap`): `a`'s slot first, then `b`'s, looked up
    /// after the first rewiring (which is what makes siblings swap only when `a` is the right
    /// child).
    fn swap_in_tree(&mut self, a: NodeId, b: NodeId) {
        let (parent_a, parent_b) = (self.nodes[a].parent, self.nodes[b].parent);
        self.replace_child(parent_a, a, b);
        self.replace_child(parent_b, b, a);
        self.nodes[a].parent = parent_b;
        self.nodes[b].parent = parent_a;
    }

    /// Swaps two nodes' places in the rank list (`swaplist`), neighbours included: exchange
    /// both links, undo the self-links neighbours get, then point the new neighbours back.
    fn swap_in_list(&mut self, a: NodeId, b: NodeId) {
        let (next_a, next_b) = (self.nodes[a].next, self.nodes[b].next);
        self.nodes[a].next = next_b;
        self.nodes[b].next = next_a;
        let (prev_a, prev_b) = (self.nodes[a].prev, self.nodes[b].prev);
        self.nodes[a].prev = prev_b;
        self.nodes[b].prev = prev_a;
        if self.nodes[a].next == Some(a) {
            self.nodes[a].next = Some(b);
        }
        if self.nodes[b].next == Some(b) {
            self.nodes[b].next = Some(a);
        }
        for node in [a, b] {
            if let Some(n) = self.nodes[node].next {
                self.nodes[n].prev = Some(node);
            }
        }
        for node in [a, b] {
            if let Some(p) = self.nodes[node].prev {
                self.nodes[p].next = Some(node);
            }
        }
    }

    /// Adds one to `node`'s weight and to its ancestors', keeping the ranks (`increment`).
    fn increment(&mut self, node: Option<NodeId>) {
        let Some(node) = node else { return };
        let weight = self.nodes[node].weight;
        // Move to the top of the block: trade places with its leader.
        if self.next_weighs(node, weight) {
            let leader = self.leader(node).expect("invariant: a block has a leader");
            if Some(leader) != self.nodes[node].parent {
                self.swap_in_tree(leader, node);
            }
            self.swap_in_list(leader, node);
        }
        // Leave the block: the node below leads what is left of it, or the block is gone.
        let cell = self.cell(node);
        match self.nodes[node].prev {
            Some(below) if self.nodes[below].weight == weight => self.cells[cell] = Some(below),
            _ => {
                self.cells[cell] = None;
                self.free_cells.push(cell);
            }
        }
        // Grow, then join the block above or found one.
        self.nodes[node].weight = weight + 1;
        self.nodes[node].head = match self.nodes[node].next {
            Some(above) if self.nodes[above].weight == weight + 1 => self.nodes[above].head,
            _ => Some(self.take_cell(node)),
        };
        if let Some(parent) = self.nodes[node].parent {
            self.increment(Some(parent));
            // A parent ranked just below its child moves above it.
            if self.nodes[node].prev == Some(parent) {
                self.swap_in_list(node, parent);
                if self.leader(node) == Some(node) {
                    let cell = self.cell(node);
                    self.cells[cell] = Some(parent);
                }
            }
        }
    }

    /// Puts a new node in the rank list right above the NYT node, in the block of weight 1
    /// that starts there, or in a block of its own.
    fn rank_above_nyt(&mut self, node: NodeId) {
        let nyt = self.nyt;
        let above = self.nodes[nyt].next;
        self.nodes[node].next = above;
        self.nodes[node].head = match above {
            Some(a) => {
                self.nodes[a].prev = Some(node);
                match self.nodes[a].weight {
                    1 => self.nodes[a].head,
                    _ => Some(self.take_cell(node)),
                }
            }
            None => Some(self.take_cell(node)),
        };
        self.nodes[nyt].next = Some(node);
        self.nodes[node].prev = Some(nyt);
    }

    /// Counts one more `byte` (`Huff_addRef`): a new leaf split off the NYT node, or an
    /// increment of its leaf.
    fn add_ref(&mut self, byte: u8) {
        if let Some(leaf) = self.leaf_of[usize::from(byte)] {
            self.increment(Some(leaf));
            return;
        }
        let nyt = self.nyt;
        self.nodes.push(Node::new(INTERNAL, 1));
        let internal = self.nodes.len() - 1;
        self.nodes.push(Node::new(u16::from(byte), 1));
        let leaf = self.nodes.len() - 1;
        self.rank_above_nyt(internal);
        self.rank_above_nyt(leaf);
        let parent = self.nodes[nyt].parent;
        self.replace_child(parent, nyt, internal);
        self.nodes[internal].left = Some(nyt);
        self.nodes[internal].right = Some(leaf);
        self.nodes[internal].parent = parent;
        self.nodes[nyt].parent = Some(internal);
        self.nodes[leaf].parent = Some(internal);
        self.leaf_of[usize::from(byte)] = Some(leaf);
        self.increment(parent);
    }

    /// The bits of `node`'s path from the root (`true` = right).
    fn path(&self, node: NodeId) -> Vec<bool> {
        let mut bits = Vec::new();
        let mut child = node;
        while let Some(parent) = self.nodes[child].parent {
            bits.push(self.nodes[parent].right == Some(child));
            child = parent;
        }
        bits.reverse();
        bits
    }

    /// Walks from the root to a leaf reading bits (`Huff_Receive`): a byte or [`NYT`].
    fn receive(&self, reader: &mut BitReader<'_>) -> u16 {
        let mut node = self.root;
        while self.nodes[node].symbol == INTERNAL {
            let next = match reader.bit() {
                1 => self.nodes[node].right,
                _ => self.nodes[node].left,
            };
            node = next.expect("invariant: an internal node has two children");
        }
        self.nodes[node].symbol
    }
}

/// The engine's bit writer over the block (`add_bit`, `send`), with its limit.
#[derive(Debug)]
struct BitWriter {
    out: Vec<u8>,
    /// The bit position (`bloc`).
    bloc: usize,
    /// `Huff_Compress`'s `maxoffset`: 8 × the input length.
    limit: usize,
    /// Whether a path was cut at the limit (the output is then garbled).
    overflowed: bool,
}

impl BitWriter {
    /// One bit at the position: a byte is cleared when its first bit is written.
    fn put(&mut self, bit: bool) {
        let byte = self.bloc >> 3;
        if self.out.len() <= byte {
            self.out.resize(byte + 1, 0);
        }
        if self.bloc & 7 == 0 {
            self.out[byte] = 0;
        }
        self.out[byte] |= u8::from(bit) << (self.bloc & 7);
        self.bloc += 1;
    }

    /// A path, root first; at or past the limit each bit is dropped and the position set to
    /// `limit + 1`.
    fn put_path(&mut self, bits: &[bool]) {
        for &bit in bits {
            if self.bloc >= self.limit {
                self.bloc = self.limit + 1;
                self.overflowed = true;
            } else {
                self.put(bit);
            }
        }
    }
}

/// The engine's bit reader over a block (`get_bit`); past the end it reads zeros.
#[derive(Debug)]
struct BitReader<'a> {
    data: &'a [u8],
    bloc: usize,
    /// Whether a bit was read past the end of `data`.
    past_end: bool,
}

impl BitReader<'_> {
    fn bit(&mut self) -> u8 {
        let byte = match self.data.get(self.bloc >> 3) {
            Some(&b) => b,
            None => {
                self.past_end = true;
                0
            }
        };
        let bit = (byte >> (self.bloc & 7)) & 1;
        self.bloc += 1;
        bit
    }

    /// Eight bits, most significant first (a new symbol after the NYT code).
    fn literal(&mut self) -> u8 {
        (0..8).fold(0u8, |acc, _| (acc << 1) | self.bit())
    }
}

/// `Huff_Compress` on `data` (everything after offset 12 of the packet): the block, and
/// whether a path was cut at the engine's limit.
fn encode(data: &[u8]) -> (Vec<u8>, bool) {
    // "if (size <= 0) return": nothing after offset 12, nothing written.
    if data.is_empty() {
        return (Vec::new(), false);
    }
    let mut w = BitWriter {
        // seq[0] = size >> 8; seq[1] = size & 0xff (as bytes)
        out: vec![(data.len() >> 8) as u8, data.len() as u8],
        bloc: 16,
        limit: data.len() * 8,
        overflowed: false,
    };
    let mut tree = Tree::new();
    for &byte in data {
        match tree.leaf_of[usize::from(byte)] {
            Some(leaf) => w.put_path(&tree.path(leaf)),
            None => {
                w.put_path(&tree.path(tree.nyt));
                for i in (0..8).rev() {
                    w.put((byte >> i) & 1 == 1);
                }
            }
        }
        tree.add_ref(byte);
    }
    // "bloc += 8; cursize = bloc >> 3": one more byte when the bits end on a boundary.
    let len = (w.bloc + 8) >> 3;
    w.out.resize(len, 0);
    (w.out, w.overflowed)
}

/// Compresses `data` exactly as `Huff_Compress(msg, 12)` does with the bytes after offset 12:
/// the block (2-byte big-endian length, then the bits). Empty data gives an empty block (the
/// engine leaves the message as it is). Data that does not compress comes out garbled, as in
/// the engine: see [`try_compress`].
pub fn compress(data: &[u8]) -> Vec<u8> {
    encode(data).0
}

/// [`compress`], or `None` when the engine's limit cuts the bitstream (the block would not
/// decompress to `data`): incompressible data such as random bytes.
pub fn try_compress(data: &[u8]) -> Option<Vec<u8>> {
    match encode(data) {
        (block, false) => Some(block),
        (_, true) => None,
    }
}

/// Decodes a block; `reader.past_end` tells whether it needed bits past the block.
fn decode(block: &[u8], max_len: usize, reader: &mut BitReader<'_>) -> Vec<u8> {
    let first = |i: usize| usize::from(block.get(i).copied().unwrap_or(0));
    if block.len() < 2 {
        reader.past_end = true;
    }
    let announced = first(0) * 256 + first(1);
    let mut out = vec![0u8; announced.min(max_len)];
    reader.bloc = 16;
    let mut tree = Tree::new();
    for slot in out.iter_mut() {
        // "don't overflow reading from the messages": stop (a NUL stays) once the position
        // is more than a byte past the block.
        if (reader.bloc >> 3) > block.len() {
            reader.past_end = true;
            break;
        }
        let byte = match tree.receive(reader) {
            NYT => reader.literal(),
            symbol => symbol as u8,
        };
        *slot = byte;
        tree.add_ref(byte);
    }
    out
}

/// What `Huff_Decompress(msg, 12)` leaves after offset 12, for a message buffer with room for
/// `max_len` bytes there (`maxsize - 12`): the announced length capped at `max_len`, decoding
/// stopped early (zeros from there) when the block runs out, bits past the block read as 0.
/// An empty block is left empty.
pub fn decompress_as_engine(block: &[u8], max_len: usize) -> Vec<u8> {
    if block.is_empty() {
        return Vec::new();
    }
    let mut reader = BitReader {
        data: block,
        bloc: 0,
        past_end: false,
    };
    decode(block, max_len, &mut reader)
}

/// Decompresses a block made by the engine (or [`compress`]): `None` when the announced length
/// is over [`MAX_DECOMPRESSED`] or the block ends before it is decoded (the engine would read
/// stale memory there). An empty block gives empty data.
pub fn decompress(block: &[u8]) -> Option<Vec<u8>> {
    if block.is_empty() {
        return Some(Vec::new());
    }
    let mut reader = BitReader {
        data: block,
        bloc: 0,
        past_end: false,
    };
    let announced = block
        .iter()
        .take(2)
        .fold(0usize, |a, &b| a * 256 + usize::from(b));
    if block.len() < 2 || announced > MAX_DECOMPRESSED {
        return None;
    }
    let out = decode(block, MAX_DECOMPRESSED, &mut reader);
    (!reader.past_end).then_some(out)
}

/// The datagram a real client sends for `connect <text>`: `FF FF FF FF connect ` then
/// [`compress`]`(text)` (`text` is `"<userinfo>"`, quotes included, no NUL).
pub fn connect_packet(text: &[u8]) -> Vec<u8> {
    let mut packet = b"\xff\xff\xff\xffconnect ".to_vec();
    packet.extend_from_slice(&compress(text));
    packet
}

/// What a server reads from a datagram whose bytes 4..11 are exactly `connect`: the first 12
/// bytes, then the block decompressed as the engine does with a buffer of `max_msglen` bytes
/// (`MAX_MSGLEN`: 16 384 in ioquake3, 32 768 in ET). Other datagrams are returned as they are.
pub fn server_view(packet: &[u8], max_msglen: usize) -> Vec<u8> {
    if packet.len() < 11 || &packet[4..11] != b"connect" || packet.len() <= CONNECT_OFFSET {
        return packet.to_vec();
    }
    let mut out = packet[..CONNECT_OFFSET].to_vec();
    let room = max_msglen.saturating_sub(CONNECT_OFFSET);
    out.extend_from_slice(&decompress_as_engine(&packet[CONNECT_OFFSET..], room));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn small_vectors_from_the_c_harness() {
        assert_eq!(compress(b""), b"");
        assert_eq!(compress(b"a"), unhex("00018600"));
        assert_eq!(decompress(&unhex("00018600")).unwrap(), b"a");
    }
}
