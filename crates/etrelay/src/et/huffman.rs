//! The adaptive Huffman code of the Quake 3 engines' `connect` packet.
//!
//! A client sends `FF FF FF FF connect ` and then its userinfo compressed from offset 12
//! (`Huff_Compress(msg, 12)`); the server decompresses it when bytes 4..11 are exactly `connect`
//! (`Huff_Decompress(msg, 12)`, `et-protocol.md` §1). The relay reads the userinfo to check its
//! `challenge` and `qport`, writes the game server's own challenge in, and compresses it again.
//!
//! The block is a 2-byte big-endian count of uncompressed bytes, then the bits, least
//! significant bit of each byte first. Encoder and decoder start from a tree holding only the
//! NYT ("not yet transmitted") leaf and update it the same way after every byte: a byte seen
//! for the first time is sent as NYT's code and its 8 bits, most significant first, and gets a
//! leaf of its own; then the weights on its path grow by one, each node first trading places
//! with the highest-ranked node of its weight (the block's leader) so that ranks stay sorted by
//! weight (Sayood, *Introduction to Data Compression*, adaptive Huffman). The engines keep the
//! ranks as a list and each weight's leader in a cell shared by the nodes of that weight; this
//! keeps the ranks in an array ([`Tree::order`]) and the leaders in cells, and must update both
//! exactly as the engines do, since the code of every byte depends on the tree before it. It is
//! checked against the real engine (the OpenArena client's `connect` read, the server reading
//! ours) and against the test kit's literal model.
//!
//! Nothing here allocates once a [`Codec`] exists: one is kept and reset for each packet.

/// The NYT leaf's symbol.
const NYT: u16 = 256;
/// The symbol of an internal node.
const INTERNAL: u16 = 257;
/// No node.
const NONE: u16 = u16::MAX;
/// Nodes at most: the NYT leaf, and a leaf and an internal node per byte value.
const MAX_NODES: usize = 1 + 2 * 256;
/// Bytes a block may hold: the engines' largest message (`MAX_MSGLEN`, ET's 32 768).
pub const MAX_BLOCK: usize = 32_768;

#[derive(Debug, Clone, Copy)]
struct Node {
    parent: u16,
    left: u16,
    right: u16,
    /// The cell naming the leader of this node's weight.
    head: u16,
    weight: u32,
    symbol: u16,
}

const EMPTY: Node = Node {
    parent: NONE,
    left: NONE,
    right: NONE,
    head: NONE,
    weight: 0,
    symbol: INTERNAL,
};

/// The tree, its ranks and its leaders.
#[derive(Debug)]
struct Tree {
    nodes: Vec<Node>,
    /// Nodes by rank, the highest first; the NYT leaf is always last (the lowest).
    order: Vec<u16>,
    /// Each node's index in `order`.
    rank: Vec<u16>,
    /// The leader cells: a node index, or `NONE` once free.
    cells: Vec<u16>,
    /// Cells free for reuse.
    free: Vec<u16>,
    /// Each symbol's leaf (`NONE`: not seen yet); index 256 is NYT.
    leaf: [u16; 257],
    root: u16,
}

impl Tree {
    fn new() -> Self {
        let mut t = Tree {
            nodes: Vec::with_capacity(MAX_NODES),
            order: Vec::with_capacity(MAX_NODES),
            rank: Vec::with_capacity(MAX_NODES),
            cells: Vec::with_capacity(MAX_NODES),
            free: Vec::with_capacity(MAX_NODES),
            leaf: [NONE; 257],
            root: 0,
        };
        t.reset();
        t
    }

    /// Back to the NYT leaf alone.
    fn reset(&mut self) {
        self.nodes.clear();
        self.order.clear();
        self.rank.clear();
        self.cells.clear();
        self.free.clear();
        self.leaf = [NONE; 257];
        self.nodes.push(Node {
            symbol: NYT,
            ..EMPTY
        });
        self.order.push(0);
        self.rank.push(0);
        self.leaf[usize::from(NYT)] = 0;
        self.root = 0;
    }

    fn node(&self, n: u16) -> &Node {
        &self.nodes[usize::from(n)]
    }

    fn node_mut(&mut self, n: u16) -> &mut Node {
        &mut self.nodes[usize::from(n)]
    }

    /// The node ranked just above `n`.
    fn next(&self, n: u16) -> u16 {
        match usize::from(self.rank[usize::from(n)]) {
            0 => NONE,
            r => self.order[r - 1],
        }
    }

    /// The node ranked just below `n`.
    fn prev(&self, n: u16) -> u16 {
        let r = usize::from(self.rank[usize::from(n)]) + 1;
        self.order.get(r).copied().unwrap_or(NONE)
    }

    fn weight(&self, n: u16) -> Option<u32> {
        (n != NONE).then(|| self.node(n).weight)
    }

    fn new_cell(&mut self, leader: u16) -> u16 {
        match self.free.pop() {
            Some(c) => {
                self.cells[usize::from(c)] = leader;
                c
            }
            None => {
                self.cells.push(leader);
                (self.cells.len() - 1) as u16
            }
        }
    }

    fn leader(&self, n: u16) -> u16 {
        self.cells[usize::from(self.node(n).head)]
    }

    fn set_leader(&mut self, n: u16, leader: u16) {
        let c = self.node(n).head;
        self.cells[usize::from(c)] = leader;
    }

    /// A new node ranked just above NYT.
    fn push_above_nyt(&mut self, node: Node) -> u16 {
        let n = self.nodes.len() as u16;
        self.nodes.push(node);
        let at = self.order.len() - 1;
        self.order.insert(at, n);
        self.rank.push(at as u16);
        let nyt = self.order[at + 1];
        self.rank[usize::from(nyt)] = (at + 1) as u16;
        n
    }

    /// Trades the tree places of `a` and `b` (their parents' child links; the engines' order of
    /// updates, which leaves two siblings as they were).
    fn swap_places(&mut self, a: u16, b: u16) {
        let (pa, pb) = (self.node(a).parent, self.node(b).parent);
        self.replace_child(pa, a, b);
        self.replace_child(pb, b, a);
        self.node_mut(a).parent = pb;
        self.node_mut(b).parent = pa;
    }

    fn replace_child(&mut self, parent: u16, old: u16, new: u16) {
        if parent == NONE {
            self.root = new;
            return;
        }
        let p = self.node_mut(parent);
        if p.left == old {
            p.left = new;
        } else {
            p.right = new;
        }
    }

    /// Trades the ranks of `a` and `b`.
    fn swap_ranks(&mut self, a: u16, b: u16) {
        let (ra, rb) = (self.rank[usize::from(a)], self.rank[usize::from(b)]);
        self.order.swap(usize::from(ra), usize::from(rb));
        self.rank[usize::from(a)] = rb;
        self.rank[usize::from(b)] = ra;
    }

    /// Adds one to the weight of `n` and of every node above it.
    fn increment(&mut self, n: u16) {
        // Each node moves up within its weight and grows, then its parent does the same; on the
        // way back down, a node ranked just above its (now as heavy) parent trades ranks with it.
        let mut path = [NONE; MAX_NODES];
        let mut depth = 0;
        let mut at = n;
        while at != NONE {
            self.grow(at);
            path[depth] = at;
            depth += 1;
            at = self.node(at).parent;
        }
        for &node in path[..depth.saturating_sub(1)].iter().rev() {
            let parent = self.node(node).parent;
            if self.prev(node) == parent {
                self.swap_ranks(node, parent);
                if self.leader(node) == node {
                    self.set_leader(node, parent);
                }
            }
        }
    }

    /// Moves `n` to the top of its weight's block and adds one to its weight.
    fn grow(&mut self, n: u16) {
        let w = self.node(n).weight;
        if self.weight(self.next(n)) == Some(w) {
            let leader = self.leader(n);
            if leader != self.node(n).parent {
                self.swap_places(leader, n);
            }
            self.swap_ranks(leader, n);
        }
        let below = self.prev(n);
        if self.weight(below) == Some(w) {
            self.set_leader(n, below);
        } else {
            let cell = self.node(n).head;
            self.cells[usize::from(cell)] = NONE;
            self.free.push(cell);
        }
        self.node_mut(n).weight = w + 1;
        let above = self.next(n);
        if self.weight(above) == Some(w + 1) {
            let shared = self.node(above).head;
            self.node_mut(n).head = shared;
        } else {
            let cell = self.new_cell(n);
            self.node_mut(n).head = cell;
        }
    }

    /// Counts one more `byte`: a new leaf if it is new, then the weights above it.
    fn add(&mut self, byte: u8) {
        let known = self.leaf[usize::from(byte)];
        if known != NONE {
            self.increment(known);
            return;
        }
        let nyt = self.leaf[usize::from(NYT)];
        let old_next = self.next(nyt);
        let inner = self.push_above_nyt(Node { weight: 1, ..EMPTY });
        let head = match self.weight(old_next) {
            Some(1) => self.node(old_next).head,
            _ => self.new_cell(inner),
        };
        self.node_mut(inner).head = head;
        let leaf = self.push_above_nyt(Node {
            weight: 1,
            symbol: u16::from(byte),
            head,
            ..EMPTY
        });
        let parent = self.node(nyt).parent;
        self.replace_child(parent, nyt, inner);
        let i = self.node_mut(inner);
        i.right = leaf;
        i.left = nyt;
        i.parent = parent;
        self.node_mut(nyt).parent = inner;
        self.node_mut(leaf).parent = inner;
        self.leaf[usize::from(byte)] = leaf;
        if parent != NONE {
            self.increment(parent);
        }
    }
}

/// Why a block could not be decompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    /// Shorter than its 2-byte length.
    #[error("compressed block shorter than its length field")]
    Short,
    /// Announces more bytes than the caller's buffer takes.
    #[error("compressed block longer than allowed")]
    TooLong,
}

/// A reusable encoder and decoder.
#[derive(Debug)]
pub struct Codec {
    tree: Tree,
    /// A leaf's code, gathered from the leaf up.
    path: Vec<bool>,
}

impl Default for Codec {
    fn default() -> Self {
        Codec {
            tree: Tree::new(),
            path: Vec::with_capacity(MAX_NODES),
        }
    }
}

impl Codec {
    /// Decompresses `block` (length field first) into `out`, replacing its contents; at most
    /// `max` bytes. When the bits run out before the announced bytes, `out` ends there, as the
    /// engines' text does (their compressor cuts a short message's last bytes: a userinfo of
    /// under about a hundred bytes loses its closing quote).
    ///
    /// # Errors
    /// [`HuffmanError`]: the block is short or announces more than `max` bytes.
    pub fn decompress(
        &mut self,
        block: &[u8],
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), HuffmanError> {
        let [hi, lo, ..] = *block else {
            return Err(HuffmanError::Short);
        };
        let count = usize::from(u16::from_be_bytes([hi, lo]));
        if count > max.min(MAX_BLOCK) {
            return Err(HuffmanError::TooLong);
        }
        out.clear();
        self.tree.reset();
        let mut bits = Bits {
            data: block,
            at: 16,
        };
        for _ in 0..count {
            match self.symbol(&mut bits) {
                Some(byte) => {
                    out.push(byte);
                    self.tree.add(byte);
                }
                None => break,
            }
        }
        Ok(())
    }

    /// The next byte of `bits`, `None` once they run out.
    fn symbol(&self, bits: &mut Bits<'_>) -> Option<u8> {
        let mut n = self.tree.root;
        while self.tree.node(n).symbol == INTERNAL {
            let node = self.tree.node(n);
            n = if bits.next()? { node.right } else { node.left };
            if n == NONE {
                return None;
            }
        }
        Some(match self.tree.node(n).symbol {
            NYT => {
                let mut b = 0u8;
                for _ in 0..8 {
                    b = (b << 1) | u8::from(bits.next()?);
                }
                b
            }
            s => s as u8,
        })
    }

    /// Compresses `data` (at most [`MAX_BLOCK`] bytes) and appends the block to `out`, sized as
    /// the engines size it (the bits' bytes, plus one).
    ///
    /// # Panics
    /// Never for `data` of up to [`MAX_BLOCK`] bytes; longer is a caller's bug.
    pub fn compress(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let count = u16::try_from(data.len()).expect("invariant: callers bound what they compress");
        let start = out.len();
        out.extend_from_slice(&count.to_be_bytes());
        self.tree.reset();
        let mut bit = 16usize;
        for &byte in data {
            let leaf = self.tree.leaf[usize::from(byte)];
            if leaf == NONE {
                self.code(self.tree.leaf[usize::from(NYT)]);
                for i in (0..8).rev() {
                    self.path.push(byte >> i & 1 == 1);
                }
                // The literal's 8 bits follow the NYT code, most significant first.
            } else {
                self.code(leaf);
            }
            for &b in &self.path {
                put(out, start, &mut bit, b);
            }
            self.path.clear();
            self.tree.add(byte);
        }
        out.resize(start + bit / 8 + 1, 0);
    }

    /// Writes the code of `n` into `self.path`, root first.
    fn code(&mut self, n: u16) {
        let from = self.path.len();
        let mut child = n;
        let mut at = self.tree.node(n).parent;
        while at != NONE {
            self.path.push(self.tree.node(at).right == child);
            child = at;
            at = self.tree.node(at).parent;
        }
        self.path[from..].reverse();
    }
}

/// Sets bit `bit` of the block starting at `start` in `out`, growing it as needed.
fn put(out: &mut Vec<u8>, start: usize, bit: &mut usize, value: bool) {
    let byte = start + *bit / 8;
    if out.len() <= byte {
        out.resize(byte + 1, 0);
    }
    out[byte] |= u8::from(value) << (*bit % 8);
    *bit += 1;
}

/// Reads bits least significant first.
struct Bits<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bits<'_> {
    fn next(&mut self) -> Option<bool> {
        let byte = *self.data.get(self.at / 8)?;
        let b = byte >> (self.at % 8) & 1 == 1;
        self.at += 1;
        Some(b)
    }
}

#[cfg(test)]
mod tests;
