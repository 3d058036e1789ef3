import DocumentEngine

/// What a file system that shows a store (DocumentFS) needs of it beyond what an app does
/// (``DocumentStore``): to prepare a file's new bytes while they are written, to make an
/// `fsync` durable before its save, and to drop its caches for cold measurements.
public protocol FileSystemStore: DocumentStore {
    /// Starts preparing a file's new bytes while they are still being written, for the save that
    /// will give them (as the ``ContentsSource/preparation`` of its source): `source` reads the
    /// file as it is being written, and the caller says which of its bytes are final
    /// (``ContentsPreparation/advance(to:)``). Nil when the store does not prepare contents.
    func prepareContents(reading source: any ContentsSource) -> (any ContentsPreparation)?

    /// Makes `changes` durable without saving them yet, as a file system's journal does: once
    /// this returns they survive a crash, and the next process that opens the store after one
    /// saves them (against their base, by their conflict policy). Normally a later durable save
    /// of the document that includes them commits them, and ``retireIntents(_:)`` then lets the
    /// log forget them. Returns nil where the store keeps no log, or where saving at once costs
    /// the disk no more than logging would (bulk writes): the caller then saves durably.
    func logIntent(_ changes: DocumentChanges) throws -> IntentID?
    /// Whether ``logIntent(_:)`` can log at all.
    var logsIntents: Bool { get }
    /// Intents whose changes a durable save has committed (or that later committed changes made
    /// obsolete): a crash no longer replays them.
    func retireIntents(_ intents: [IntentID])

    /// Drops chunks cached in memory, so the next reads come from the database (for tests and
    /// benchmarks that measure cold reads).
    func purgeCache()

    /// The store's lock tables, which every mount of it shares; nil for a store without them
    /// (a mount then keeps its locks to itself).
    var sharedLocks: (any SharedLockStore)? { get }
}

extension FileSystemStore {
    /// None: a save does all of its work itself.
    public func prepareContents(reading source: any ContentsSource) -> (any ContentsPreparation)? { nil }

    /// A store without an intent log: every durable save is a durable commit.
    public func logIntent(_ changes: DocumentChanges) throws -> IntentID? { nil }
    public var logsIntents: Bool { false }
    public func retireIntents(_ intents: [IntentID]) {}

    /// A store without a cache has nothing to drop.
    public func purgeCache() {}

    public var sharedLocks: (any SharedLockStore)? { nil }
}

/// Changes a store logged durably before saving them (``FileSystemStore/logIntent(_:)``).
public struct IntentID: RawRepresentable, Hashable, Comparable, Sendable {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
}
