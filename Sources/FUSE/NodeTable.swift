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
///
/// The root (``NodeID/root``) is pinned to `root` and never forgotten.
public final class NodeTable<Key: Hashable & Sendable>: Sendable {
    private struct Node {
        var key: Key
        var lookups: UInt64
        var generation: Generation
    }
    private struct State {
        var nodes: [UInt64: Node] = [:]
        var ids: [Key: UInt64] = [:]
        /// Released node ids with the generation they last had.
        var free: [(id: UInt64, generation: Generation)] = []
        var next: UInt64 = NodeID.root.rawValue + 1
    }

    private let state: Mutex<State>
    private let onForget: (@Sendable (Key, NodeID) -> Void)?
    /// The key of the root directory.
    public let rootKey: Key

    /// - Parameters:
    ///   - root: the key of the root directory.
    ///   - onForget: runs when a node loses its last kernel reference.
    public init(root: Key, onForget: (@Sendable (Key, NodeID) -> Void)? = nil) {
        rootKey = root
        self.onForget = onForget
        var initial = State()
        initial.nodes[NodeID.root.rawValue] = Node(key: root, lookups: 1, generation: Generation(0))
        initial.ids[root] = NodeID.root.rawValue
        state = Mutex(initial)
    }

    /// Counts one kernel lookup of `key`, giving it a node id if it has none. Use this only when
    /// sending an entry by hand; the table-taking reply methods call it for you.
    public func acquire(_ key: Key) -> (node: NodeID, generation: Generation) {
        state.withLock { state in
            if let id = state.ids[key], var node = state.nodes[id] {
                if id != NodeID.root.rawValue { node.lookups += 1 }
                state.nodes[id] = node
                return (NodeID(id), node.generation)
            }
            let id: UInt64
            let generation: Generation
            if let reused = state.free.popLast() {
                id = reused.id
                generation = Generation(reused.generation.rawValue + 1)
            } else {
                id = state.next
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
        return state.withLock { state -> Key? in
            guard var entry = state.nodes[node.rawValue] else { return nil }
            // More forgets than lookups is a bug somewhere; treat it as "all gone".
            entry.lookups -= min(lookups, entry.lookups)
            if entry.lookups > 0 {
                state.nodes[node.rawValue] = entry
                return nil
            }
            state.nodes[node.rawValue] = nil
            state.ids[entry.key] = nil
            state.free.append((node.rawValue, entry.generation))
            return entry.key
        }
    }

    /// The key a node id stands for, or nil if the kernel holds no such node.
    public func key(for node: NodeID) -> Key? {
        state.withLock { $0.nodes[node.rawValue]?.key }
    }

    /// The node id of `key` if the kernel knows it (for notifications); counts nothing.
    public func node(for key: Key) -> NodeID? {
        state.withLock { $0.ids[key].map { NodeID($0) } }
    }

    /// The kernel's current lookup count of `node` (0 if unknown).
    public func lookupCount(of node: NodeID) -> UInt64 {
        state.withLock { $0.nodes[node.rawValue]?.lookups ?? 0 }
    }

    /// How many nodes the kernel holds, the root included.
    public var count: Int { state.withLock { $0.nodes.count } }
}
