#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Where a lock stands in the project's lock order (docs/design/concurrency.md).
///
/// A thread takes ranked locks in increasing rank. Locks of one rank that ``allowsSeveral`` are
/// taken in increasing key order (a document's saving lock by document id); of any other rank,
/// one at a time. Debug builds check this on every acquisition and stop the process at the first
/// lock taken out of order, naming the locks the thread holds.
package struct LockRank: Comparable, Hashable, Sendable, CustomStringConvertible {
    package let value: Int
    package let name: String
    /// Whether a thread may hold several locks of this rank, taken in increasing key order.
    package let allowsSeveral: Bool

    package init(_ value: Int, _ name: String, allowsSeveral: Bool = false) {
        self.value = value
        self.name = name
        self.allowsSeveral = allowsSeveral
    }

    package static func < (a: LockRank, b: LockRank) -> Bool { a.value < b.value }
    package static func == (a: LockRank, b: LockRank) -> Bool { a.value == b.value }
    package func hash(into hasher: inout Hasher) { hasher.combine(value) }
    package var description: String { name }
}

extension LockRank {
    // The order, first taken first. Gaps leave room for locks that come later.

    /// `DocumentState.saving` in DocumentFS: serialises saves of one document; held across store
    /// transactions. Several are taken in document id order.
    package static let documentSaving = LockRank(10, "document saving", allowsSeveral: true)
    /// `ViewNode.changes` in DocumentFS: a change of one file's bytes, across its spill I/O.
    package static let fileChanges = LockRank(20, "file changes")
    /// One finish of a file's preparation at a time (VersionedStore's `PreparedContents`).
    package static let preparationFinish = LockRank(30, "preparation finish")
    /// The in-memory store's writer: one write transaction at a time.
    package static let storeWriter = LockRank(40, "store writer")
    /// The mount's view (`DocumentFileSystem.state`): never held across store or spill I/O.
    package static let view = LockRank(50, "view")
    /// A lock whose holder takes no other ranked lock: a monitor's state, the texts of the XML
    /// views. (`Mutex`es, the other leaf locks, are not ranked: their bodies take no lock.)
    package static let leaf = LockRank(90, "leaf")
}

/// The debug builds' check of the lock order, per thread.
package enum LockOrder {
    /// Why taking `rank` (with `key`) while holding `held` breaks the order, or nil if it does
    /// not.
    package static func violation(taking rank: LockRank, key: Int, holding held: [(LockRank, Int)])
        -> String?
    {
        for (heldRank, heldKey) in held {
            if heldRank < rank { continue }
            if heldRank == rank, rank.allowsSeveral, heldKey < key { continue }
            let list = held.map { "\($0.0) (\($0.1))" }.joined(separator: ", ")
            return "lock order: taking \(rank) (\(key)) while holding \(list)"
        }
        return nil
    }

    #if DEBUG
        /// The ranked locks the calling thread holds, in the order it took them.
        package static var held: [(LockRank, Int)] { HeldLocks.current.entries }

        static func willAcquire(_ rank: LockRank, key: Int) {
            let current = HeldLocks.current
            if let problem = violation(taking: rank, key: key, holding: current.entries) {
                fatalError(problem)
            }
        }

        static func didAcquire(_ rank: LockRank, key: Int) {
            HeldLocks.current.entries.append((rank, key))
        }

        static func didRelease(_ rank: LockRank, key: Int) {
            let current = HeldLocks.current
            if let index = current.entries.lastIndex(where: { $0.0 == rank && $0.1 == key }) {
                current.entries.remove(at: index)
            }
        }
    #endif
}

#if DEBUG
    /// The calling thread's ranked locks, in a pthread key (a thread-local that lives as long as
    /// its thread, whatever started it).
    private final class HeldLocks {
        var entries: [(LockRank, Int)] = []

        private static let key: pthread_key_t = {
            var key = pthread_key_t()
            pthread_key_create(&key) { raw in
                guard let raw else { return }
                Unmanaged<HeldLocks>.fromOpaque(raw).release()
            }
            return key
        }()

        static var current: HeldLocks {
            if let raw = pthread_getspecific(key) {
                return Unmanaged<HeldLocks>.fromOpaque(raw).takeUnretainedValue()
            }
            let held = HeldLocks()
            pthread_setspecific(key, Unmanaged.passRetained(held).toOpaque())
            return held
        }
    }
#endif
