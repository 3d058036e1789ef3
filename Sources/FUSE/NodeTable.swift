import Synchronization

/// Maps a filesystem's own stable ids (`Key`) to kernel node ids and keeps the kernel's
/// lookup counts, so a filesystem never does forget arithmetic itself.
///
/// - The entry replies that take a table (``ReplyEntry/entry(_:in:attributes:attributeTimeout:entryTimeout:)``,
///   ``ReplyCreate``, ``ReplyDirectoryPlus``) count one lookup per delivered entry.
/// - Forward `forget` and `batchForget` to ``forget(_:lookups:)`` / ``forget(_:)``.
/// - When a node's count reaches zero the kernel has no reference left: the node id is
///   released and `onForget` runs (outside the lock), e.g. to free an unlinked file's data.
/// - A released node id may be reused for another key with a higher ``Generation``, so
///   (node id, generation) never names two different nodes.
/// - ``retire(_:)`` gives a key a new node id from its next lookup on, while the kernel's old
///   inode keeps its id until forgotten: a key can then have several node ids, and `onForget`
///   runs when the last of them is forgotten.
///
/// The root (``NodeID/root``) is pinned to `root` and never forgotten.
///
/// The table is sharded by key, each shard behind a lock of its own, and a node id names its
/// shard: a request touches one shard, so requests of other keys never wait for it.
public final class NodeTable<Key: Hashable & Sendable>: Sendable {
    private struct Node {
        var key: Key
        var lookups: UInt64
        var generation: Generation
    }
    private struct Shard {
        var nodes: [UInt64: Node] = [:]
        /// The node id that the next lookup of a key gets.
        var ids: [Key: UInt64] = [:]
        /// Older node ids of keys, still held by the kernel (see ``retire(_:)``).
        var retired: [Key: [UInt64]] = [:]
        /// Released node ids with the generation they last had.
        var free: [(id: UInt64, generation: Generation)] = []
        /// The next local number; 0 is never used, so no node id is 0 or the root's.
        var next: UInt64 = 1
    }

    /// Node ids are `local << shardBits | shard`.
    private static var shardBits: Int { 4 }
    private static var shardCount: Int { 1 << shardBits }
    /// A shard behind its own lock (a class: an array cannot hold a lock itself).
    private final class Locked: Sendable {
        let shard = Mutex(Shard())
    }
    private let shards: [Locked]
    private let onForget: (@Sendable (Key, NodeID) -> Void)?
    /// The key of the root directory.
    public let rootKey: Key

    /// - Parameters:
    ///   - root: the key of the root directory.
    ///   - onForget: runs when a node loses its last kernel reference.
    public init(root: Key, onForget: (@Sendable (Key, NodeID) -> Void)? = nil) {
        rootKey = root
        self.onForget = onForget
        shards = (0..<Self.shardCount).map { _ in Locked() }
    }

    private func shard(of key: Key) -> Int { Int(UInt(bitPattern: key.hashValue) % UInt(Self.shardCount)) }
    private func shard(of node: UInt64) -> Int { Int(node & UInt64(Self.shardCount - 1)) }

    /// Counts one kernel lookup of `key`, giving it a node id if it has none. Use this only when
    /// sending an entry by hand; the table-taking reply methods call it for you.
    public func acquire(_ key: Key) -> (node: NodeID, generation: Generation) {
        if key == rootKey { return (.root, Generation(0)) }
        let index = shard(of: key)
        return shards[index].shard.withLock { state in
            if let id = state.ids[key], var node = state.nodes[id] {
                node.lookups += 1
                state.nodes[id] = node
                return (NodeID(id), node.generation)
            }
            let id: UInt64
            let generation: Generation
            if let reused = state.free.popLast() {
                id = reused.id
                generation = Generation(reused.generation.rawValue + 1)
            } else {
                id = state.next << UInt64(Self.shardBits) | UInt64(index)
                state.next += 1
                generation = Generation(0)
            }
            state.nodes[id] = Node(key: key, lookups: 1, generation: generation)
            state.ids[key] = id
            return (NodeID(id), generation)
        }
    }

    /// The kernel dropped `lookups` references to `node`.
    public func forget(_ node: NodeID, lookups: UInt64) {
        if let key = release(node, lookups) { onForget?(key, node) }
    }

    /// A `batchForget`.
    public func forget(_ items: [ForgetItem]) {
        for item in items { forget(item.node, lookups: item.lookups) }
    }

    private func release(_ node: NodeID, _ lookups: UInt64) -> Key? {
        guard node != .root else { return nil }
        return shards[shard(of: node.rawValue)].shard.withLock { state -> Key? in
            guard var entry = state.nodes[node.rawValue] else { return nil }
            // More forgets than lookups is a bug somewhere; treat it as "all gone".
            entry.lookups -= min(lookups, entry.lookups)
            if entry.lookups > 0 {
                state.nodes[node.rawValue] = entry
                return nil
            }
            state.nodes[node.rawValue] = nil
            state.free.append((node.rawValue, entry.generation))
            if state.ids[entry.key] == node.rawValue {
                state.ids[entry.key] = nil
            } else if var older = state.retired[entry.key] {
                older.removeAll { $0 == node.rawValue }
                state.retired[entry.key] = older.isEmpty ? nil : older
            }
            // The key is gone from the kernel only when none of its node ids is left.
            guard state.ids[entry.key] == nil, state.retired[entry.key] == nil else { return nil }
            return entry.key
        }
    }

    /// Makes the next lookup of `key` get a new node id, so that the kernel makes a new inode for
    /// it instead of updating the one it has. The old node id keeps standing for `key` (open
    /// files keep using it) until the kernel forgets it.
    ///
    /// This is how a file whose size changed elsewhere reaches a kernel that keeps sizes itself
    /// (the writeback cache): invalidate the key's entries after retiring it.
    /// - Returns: whether the kernel held a node for `key`.
    @discardableResult
    public func retire(_ key: Key) -> Bool {
        guard key != rootKey else { return false }
        return shards[shard(of: key)].shard.withLock { state in
            guard let id = state.ids.removeValue(forKey: key) else { return false }
            state.retired[key, default: []].append(id)
            return true
        }
    }

    /// The key a node id stands for, or nil if the kernel holds no such node.
    public func key(for node: NodeID) -> Key? {
        if node == .root { return rootKey }
        return shards[shard(of: node.rawValue)].shard.withLock { $0.nodes[node.rawValue]?.key }
    }

    /// The node id of `key` if the kernel knows it (for notifications); counts nothing. For a
    /// retired key not looked up since, its newest old node id.
    public func node(for key: Key) -> NodeID? {
        if key == rootKey { return .root }
        return shards[shard(of: key)].shard.withLock {
            ($0.ids[key] ?? $0.retired[key]?.last).map { NodeID($0) }
        }
    }

    /// Whether `node` is the node id its key's lookups get now: false for a retired or unknown one.
    public func isCurrent(_ node: NodeID) -> Bool {
        if node == .root { return true }
        return shards[shard(of: node.rawValue)].shard.withLock { state in
            guard let key = state.nodes[node.rawValue]?.key else { return false }
            return state.ids[key] == node.rawValue
        }
    }

    /// Every node id the kernel holds for `key`: the current one and retired ones.
    public func nodes(for key: Key) -> [NodeID] {
        if key == rootKey { return [.root] }
        return shards[shard(of: key)].shard.withLock { state in
            ((state.retired[key] ?? []) + (state.ids[key].map { [$0] } ?? [])).map { NodeID($0) }
        }
    }

    /// The kernel's current lookup count of `node` (0 if unknown).
    public func lookupCount(of node: NodeID) -> UInt64 {
        if node == .root { return 1 }
        return shards[shard(of: node.rawValue)].shard.withLock { $0.nodes[node.rawValue]?.lookups ?? 0 }
    }

    /// How many nodes the kernel holds, the root included.
    public var count: Int {
        1 + shards.reduce(0) { total, shard in total + shard.shard.withLock { $0.nodes.count } }
    }
}
