import DocumentEngine
import Foundation
import Synchronization

/// The versioned-store algorithm, once, over any ``StoreBackend``.
///
/// History is kept without copying: a wrapper is a series of immutable rows, one per version that
/// changed it, and a file's contents are extent rows (a chunk at a byte offset), one per version
/// that changed what starts at that offset. The state at version V is, per wrapper (and per
/// offset), the row with the highest version ≤ V. So a save writes only the rows it changes, and reading an old version needs no
/// copy. Branch 0 is the main line; a conflict version's rows carry its own id as branch and apply
/// on top of the main line as of the version it was based on.
///
/// Contents are content-defined chunks (at most a chunk size long) stored once per SHA-256, shared between wrappers, documents and
/// versions; all-zero chunks are holes. A save's contents come in as data or as a source that
/// never calls the store: bytes the store already holds (a copy, a file derived from another)
/// are named by node and version and resolved inside the transaction.
public final class VersionedStore: Sendable {
    /// The default chunk size: small enough that a small edit costs little, large enough that a
    /// sequential read is a few thousand lookups per GiB.
    public static let defaultChunkSize = 256 * 1024
    /// The largest chunk size a store may be created with.
    public static let maximumChunkSize = 64 << 20

    public let backend: any StoreBackend
    public var location: String { backend.location }
    public var chunkSize: Int { backend.chunkSize }
    private let counters = Mutex(StoreStatistics())
    private let prepared = Atomic<Int64>(0)
    private let cache = Mutex(ChunkCache(capacity: ChunkCache.storeCapacity))
    /// What reads at saved versions learned: a file's size and chunk ids by index (immutable).
    private let pinned = Mutex(PinnedFiles())
    /// Commits through this store that did not wait for the disk, and how many of them a sync or
    /// a durable commit has covered since: an `fsync` after a durable save needs no second sync.
    private let durability = Mutex((deferred: 0, covered: 0))

    /// How contents are cut into chunks: content-defined, at most a chunk size long, and finer
    /// for small files (``Chunking/Policy``).
    let chunking: Chunking.Policy

    public init(backend: any StoreBackend) {
        self.backend = backend
        chunking = Chunking.Policy(chunkSize: backend.chunkSize)
    }

    public var statistics: StoreStatistics {
        var statistics = counters.withLock { $0 }
        statistics.bytesPrepared = prepared.load(ordering: .relaxed)
        return statistics
    }

    /// Counts bytes a preparation cut ahead (``StoreStatistics/bytesPrepared``): atomic, since
    /// its low-priority thread must not hold a lock that saves take.
    func countPrepared(_ bytes: Int64) { prepared.add(bytes, ordering: .relaxed) }

    // MARK: Documents

    public func documents() throws -> [DocumentInfo] {
        try backend.access { try $0.documents(deleted: false) }
    }

    public func deletedDocuments() throws -> [DocumentInfo] {
        try backend.access { try $0.documents(deleted: true) }
    }

    public func document(_ id: DocumentID) throws -> DocumentInfo {
        try backend.access { try Self.fetchDocument($0, id) }
    }

    public func document(named name: String) throws -> DocumentInfo? {
        try backend.access { try $0.liveDocument(named: name) }
    }

    public func currentVersion(of id: DocumentID) throws -> VersionID {
        try backend.currentVersion(of: id) ?? document(id).currentVersion
    }

    static func fetchDocument(_ tx: any StoreTransaction, _ id: DocumentID) throws -> DocumentInfo {
        guard let document = try tx.document(id) else {
            throw DocumentStoreError.noSuchDocument(id.description)
        }
        return document
    }

    public func createDocument(named name: String, root: DocumentRoot, type: String?, origin: String) throws
        -> DocumentInfo
    {
        try write(durable: true) { tx in
            try createDocument(tx, named: name, root: root, type: type, origin: origin)
        }
    }

    func createDocument(
        _ tx: any StoreTransaction, named name: String, root: DocumentRoot, type: String?, origin: String,
        contents: ContentUpdate? = nil
    ) throws -> DocumentInfo {
        try Self.validateDocumentName(name)
        if contents != nil && root.kind != .regularFile {
            throw DocumentStoreError.invalidChange(
                "\(name.debugDescription) is not a regular file: it has no contents")
        }
        if root.kind == .symbolicLink && root.linkTarget == nil {
            throw DocumentStoreError.invalidChange("link \(name.debugDescription) has no destination")
        }
        let kind = root.documentKind
        let isDevice = root.kind == .characterDevice || root.kind == .blockDevice
        let defaultPermissions = root.kind == .directory ? 0o755 : root.kind == .symbolicLink ? 0o777 : 0o644
        try Self.requireFreeName(tx, name)
        let now = Timestamp.now
        let rootID = StoreNodeID(rawValue: try tx.reserveNodeIDs(count: 1))
        let document = try tx.insertDocument(
            name: name, type: type ?? DocumentInfo.typeIdentifier(forName: name), kind: kind,
            root: rootID,
            created: now)
        let version = try tx.insertVersion(document: document, base: nil, origin: origin, created: now)
        var record = NodeRecord(
            id: rootID, document: document, parent: nil, name: name, kind: root.kind,
            permissions: root.permissions ?? defaultPermissions, uid: root.uid ?? UInt32(getuid()),
            gid: root.gid ?? UInt32(getgid()), modified: now,
            linkTarget: root.kind == .symbolicLink ? root.linkTarget : nil,
            device: isDevice ? root.device : 0)
        if let contents {
            // The first contents are written at the version that creates the file.
            let writer = ContentWriter(
                store: self, tx: tx, node: rootID, previousSize: nil, lineage: .current, branch: 0,
                version: version, precut: finishedPreparation(of: contents))
            let written = try writer.write(contents)
            record.size = written.size
            _ = try tx.updateVersion(version, .bytesWritten(written.bytes))
            counters.withLock {
                $0.chunksWritten += written.chunks
                $0.bytesWritten += written.bytes
            }
        }
        try tx.insertNode(StoredNode(record: record.at(version), branch: 0, removed: false))
        try tx.updateDocument(document, .currentVersion(version, modified: now))
        try tx.insertEvent(
            .created, document: document, version: version, name: name, origin: origin, time: now)
        counters.withLock { $0.nodesWritten += 1 }
        return try Self.fetchDocument(tx, document)
    }

    public func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo {
        try write(durable: true) { tx in try Self.renameDocument(tx, id, to: name) }
    }

    static func renameDocument(_ tx: any StoreTransaction, _ id: DocumentID, to name: String) throws
        -> DocumentInfo
    {
        try validateDocumentName(name)
        let current = try fetchDocument(tx, id)
        if current.name == name { return current }
        try requireFreeName(tx, name, except: id)
        let now = Timestamp.now
        try tx.updateDocument(id, .rename(name, modified: now))
        try tx.insertEvent(
            .renamed, document: id, version: current.currentVersion, name: name, origin: "", time: now)
        return try fetchDocument(tx, id)
    }

    /// Swaps two live documents' names, through a name no document can have (the store's names
    /// are unique among live documents at every statement, not only at the commit).
    static func exchangeDocuments(_ tx: any StoreTransaction, _ first: DocumentID, _ second: DocumentID)
        throws -> (DocumentInfo, DocumentInfo)
    {
        let a = try fetchDocument(tx, first)
        let b = try fetchDocument(tx, second)
        guard a.deleted == nil else { throw DocumentStoreError.noSuchDocument(first.description) }
        guard b.deleted == nil else { throw DocumentStoreError.noSuchDocument(second.description) }
        guard first != second else { return (a, b) }
        let now = Timestamp.now
        // A slash is in no valid name.
        try tx.updateDocument(second, .rename("/exchange/\(second.rawValue)", modified: now))
        try tx.updateDocument(first, .rename(b.name, modified: now))
        try tx.updateDocument(second, .rename(a.name, modified: now))
        try tx.insertEvent(
            .renamed, document: first, version: a.currentVersion, name: b.name, origin: "", time: now)
        try tx.insertEvent(
            .renamed, document: second, version: b.currentVersion, name: a.name, origin: "", time: now)
        return (try fetchDocument(tx, first), try fetchDocument(tx, second))
    }

    public func deleteDocument(_ id: DocumentID, origin: String) throws {
        try write(durable: true) { tx in try Self.deleteDocument(tx, id, origin: origin) }
    }

    static func deleteDocument(_ tx: any StoreTransaction, _ id: DocumentID, origin: String) throws {
        let current = try Self.fetchDocument(tx, id)
        let now = Timestamp.now
        if current.deleted == nil { try tx.updateDocument(id, .deleted(now)) }
        try tx.insertEvent(
            .deleted, document: id, version: current.currentVersion, name: current.name, origin: origin,
            time: now)
    }

    public func transaction<T>(durable: Bool, _ body: (any DocumentStoreTransaction) throws -> T) throws -> T
    {
        try write(durable: durable) { tx in try body(Transaction(store: self, tx: tx)) }
    }

    /// A ``DocumentStoreTransaction`` over one write transaction of the backend.
    struct Transaction: DocumentStoreTransaction {
        let store: VersionedStore
        let tx: any StoreTransaction

        func document(_ id: DocumentID) throws -> DocumentInfo { try VersionedStore.fetchDocument(tx, id) }
        func document(named name: String) throws -> DocumentInfo? { try tx.liveDocument(named: name) }
        func node(_ id: StoreNodeID) throws -> NodeRecord? {
            try VersionedStore.node(tx, id, lineage: .current)
        }
        func createDocument(
            named name: String, root: DocumentRoot, type: String?, origin: String, contents: ContentUpdate?
        ) throws -> DocumentInfo {
            try store.createDocument(
                tx, named: name, root: root, type: type, origin: origin, contents: contents)
        }
        func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo {
            try VersionedStore.renameDocument(tx, id, to: name)
        }
        func exchangeDocuments(_ first: DocumentID, _ second: DocumentID) throws -> (
            DocumentInfo, DocumentInfo
        ) {
            try VersionedStore.exchangeDocuments(tx, first, second)
        }
        func restore(_ version: VersionID, of document: DocumentID, origin: String) throws -> SaveResult {
            try store.restore(tx, version, of: document, origin: origin)
        }
        func deleteDocument(_ id: DocumentID, origin: String) throws {
            try VersionedStore.deleteDocument(tx, id, origin: origin)
        }
        func save(_ changes: DocumentChanges) throws -> SaveResult {
            var carried: [CarriedExtents] = []  // committed later, if at all: not carried
            return try store.save(tx, changes, event: nil, carried: &carried)
        }
        func resolveConflict(_ version: VersionID) throws { try VersionedStore.resolveConflict(tx, version) }
        func undeleteDocument(_ id: DocumentID, as name: String?) throws -> DocumentInfo {
            try VersionedStore.undeleteDocument(tx, id, as: name)
        }
        func setting(_ key: String) throws -> String? { try tx.setting(key) }
        func setSetting(_ key: String, _ value: String) throws { try tx.setSetting(key, value) }
    }

    public func undeleteDocument(_ id: DocumentID, as name: String?) throws -> DocumentInfo {
        try write(durable: true) { tx in try Self.undeleteDocument(tx, id, as: name) }
    }

    static func undeleteDocument(_ tx: any StoreTransaction, _ id: DocumentID, as name: String?) throws
        -> DocumentInfo
    {
        let current = try Self.fetchDocument(tx, id)
        let newName = name ?? current.name
        try Self.validateDocumentName(newName)
        try Self.requireFreeName(tx, newName, except: id)
        try tx.updateDocument(id, .undeleted(name: newName))
        try tx.insertEvent(
            .restored, document: id, version: current.currentVersion, name: newName, origin: "", time: .now)
        return try Self.fetchDocument(tx, id)
    }

    /// Throws unless no live document other than `except` is named `name`.
    static func requireFreeName(_ tx: any StoreTransaction, _ name: String, except id: DocumentID? = nil)
        throws
    {
        if let other = try tx.liveDocument(named: name), other.id != id {
            throw DocumentStoreError.documentExists(name)
        }
    }

    static func validateDocumentName(_ name: String) throws {
        if let reason = FileName.problem(with: name) {
            throw DocumentStoreError.invalidName(name, reason: reason)
        }
    }

    // MARK: Reading wrappers

    public func nodes(of document: DocumentID, at version: VersionID?) throws -> [NodeRecord] {
        try backend.read { tx in
            _ = try Self.fetchDocument(tx, document)
            let lineage = try Lineage.of(tx, version)
            guard lineage.branch == 0 else {
                return try Self.resolvingLinks(
                    Self.nodes(tx, document: document, lineage: lineage).values.sorted { $0.id < $1.id })
            }
            // On the main line each node has one latest row: no dictionary needed, and the rows
            // come mostly in node order, which the sort finds in one pass.
            var records: [NodeRecord] = []
            for row in try tx.latestNodes(of: document, branch: 0, upTo: lineage.limit) where !row.removed {
                records.append(row.record)
            }
            records.sort { $0.id < $1.id }
            return try Self.resolvingLinks(records)
        }
    }

    /// A document's records with each hard link read as the file it names (they are all in
    /// `records`, sorted by id).
    static func resolvingLinks(_ records: [NodeRecord]) throws -> [NodeRecord] {
        guard records.contains(where: { $0.linkOf != nil }) else { return records }
        var byID: [StoreNodeID: NodeRecord] = [:]
        for record in records { byID[record.id] = record }
        return try records.map { record in
            guard let target = record.linkOf else { return record }
            guard let file = byID[target], file.linkOf == nil else {
                throw DocumentStoreError.corrupt(
                    path: "",
                    reason: "hard link \(record.id) (\(record.name)) names a missing wrapper \(target)")
            }
            return record.resolvingLink(to: file)
        }
    }

    /// `record`, read as the file it names when it is a hard link.
    static func resolvingLink(_ record: NodeRecord?, _ file: (StoreNodeID) throws -> NodeRecord?) throws
        -> NodeRecord?
    {
        guard let record, let target = record.linkOf else { return record }
        guard let named = try file(target), named.linkOf == nil else {
            throw DocumentStoreError.corrupt(
                path: "", reason: "hard link \(record.id) (\(record.name)) names a missing wrapper \(target)")
        }
        return record.resolvingLink(to: named)
    }

    /// The live records of a document as of `lineage`.
    static func nodes(_ tx: any StoreTransaction, document: DocumentID, lineage: Lineage) throws
        -> [StoreNodeID: NodeRecord]
    {
        var result: [StoreNodeID: NodeRecord] = [:]
        for row in try tx.latestNodes(of: document, branch: 0, upTo: lineage.limit) where !row.removed {
            result[row.record.id] = row.record
        }
        if lineage.branch != 0 {
            for row in try tx.latestNodes(of: document, branch: lineage.branch, upTo: .max) {
                result[row.record.id] = row.removed ? nil : row.record
            }
        }
        return result
    }

    public func node(_ id: StoreNodeID, at version: VersionID?) throws -> NodeRecord? {
        try Self.resolvingLink(unresolvedNode(id, at: version)) { try unresolvedNode($0, at: version) }
    }

    /// The record as stored: a hard link's own row.
    func unresolvedNode(_ id: StoreNodeID, at version: VersionID?) throws -> NodeRecord? {
        if let version, let answer = try backend.mainLineLookups([NodeLookup(id, at: version)])?.first,
            case .record(let record) = try answer.get()
        {
            return record
        }
        return try backend.read { tx in try Self.node(tx, id, lineage: Lineage.of(tx, version, reading: id)) }
    }

    public func nodes(_ lookups: [NodeLookup]) throws -> [Result<NodeRecord?, any Error>] {
        var results: [Result<NodeRecord?, any Error>] = []
        results.reserveCapacity(lookups.count)
        var start = lookups.startIndex
        while start < lookups.endIndex {
            let end = min(start + 2_000, lookups.endIndex)
            let batch = Array(lookups[start..<end])
            if let answers = try backend.mainLineLookups(batch) {
                for (lookup, answer) in zip(batch, answers) {
                    results.append(
                        Result {
                            switch try answer.get() {
                            case .record(let record):
                                return try Self.resolvingLink(record) { try node($0, at: lookup.version) }
                            case .onConflictBranch, .noSuchVersion:
                                return try node(lookup.node, at: lookup.version)
                            }
                        })
                }
            } else {
                results += batch.map { lookup in Result { try node(lookup.node, at: lookup.version) } }
            }
            start = end
        }
        return results
    }

    static func node(_ tx: any StoreTransaction, _ id: StoreNodeID, lineage: Lineage) throws -> NodeRecord? {
        if lineage.branch != 0, let row = try tx.latestNode(id, branch: lineage.branch, upTo: .max) {
            return row.removed ? nil : row.record
        }
        guard let row = try tx.latestNode(id, branch: 0, upTo: lineage.limit) else { return nil }
        return row.removed ? nil : row.record
    }

    // MARK: Reading contents

    public func readContents(of node: StoreNodeID, at version: VersionID?, offset: Int64, count: Int) throws
        -> Data
    {
        guard offset >= 0, count >= 0 else {
            throw DocumentStoreError.invalidChange("negative offset or count")
        }
        // A saved version never changes: what a read at one learned serves the next without the
        // database (and a mount keeps reading what it read while a server is away).
        if let entry = pinnedEntry(node, version, until: Self.end(offset, count)),
            let data = try pinnedRead(entry, offset: offset, count: count)
        {
            return data
        }
        return try unpinnedRead(of: node, at: version, offset: offset, count: count)
    }

    /// Reads `node`'s bytes from `offset` into `buffer`: the count read, fewer than the buffer
    /// holds only at the end of the file.
    ///
    /// A random read of a part of a chunk at a saved version goes from the backend straight
    /// into `buffer`, without the copies, sets and maps of ``readContents(of:at:offset:count:)``.
    public func readContents(
        of node: StoreNodeID, at version: VersionID?, offset: Int64,
        into buffer: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        guard offset >= 0 else { throw DocumentStoreError.invalidChange("negative offset") }
        let data: Data
        if let entry = pinnedEntry(node, version, until: Self.end(offset, buffer.count)) {
            if let count = try directRead(entry, offset: offset, into: buffer) { return count }
            data =
                try pinnedRead(entry, offset: offset, count: buffer.count)
                ?? unpinnedRead(of: node, at: version, offset: offset, count: buffer.count)
        } else {
            data = try unpinnedRead(of: node, at: version, offset: offset, count: buffer.count)
        }
        return data.copyPrefix(into: buffer)
    }

    /// What earlier reads at saved version `version` learned of `node`, as it was before this
    /// read, which ends at `end`; nil when they learned nothing (or `version` is nil).
    private func pinnedEntry(_ node: StoreNodeID, _ version: VersionID?, until end: Int64) -> PinnedFile? {
        guard let version else { return nil }
        return pinned.withLock { $0.reading(PinnedKey(node: node, version: version), until: end) }
    }

    /// Where a read of `count` bytes from `offset` ends, at most `Int64.max` (a caller may ask for
    /// all there is with `Int.max`).
    private static func end(_ offset: Int64, _ count: Int) -> Int64 {
        let (sum, overflow) = offset.addingReportingOverflow(Int64(count))
        return overflow ? .max : sum
    }

    /// A read the pinned extents cannot answer: through a transaction.
    private func unpinnedRead(of node: StoreNodeID, at version: VersionID?, offset: Int64, count: Int) throws
        -> Data
    {
        let mainLine = try version.flatMap { version in
            try backend.mainLineLookups([NodeLookup(node, at: version)])?.first.map { try $0.get() }
        }
        var linked: StoreNodeID?
        let data = try backend.read { tx -> Data in
            let lineage: Lineage
            let found: NodeRecord?
            if let version, case .record(let record) = mainLine {
                (lineage, found) = (Lineage(limit: version.rawValue, branch: 0), record)
            } else {
                lineage = try Lineage.of(tx, version, reading: node)
                found = try Self.node(tx, node, lineage: lineage)
            }
            guard let record = found else { throw DocumentStoreError.noSuchNode(node) }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(node) }
            if let target = record.linkOf {
                // A hard link's bytes are the file's it names.
                linked = target
                return Data()
            }
            let end = min(record.size, offset + Int64(count))
            guard offset < end else { return Data() }
            // An extent that covers `offset` begins at most one extent length before it. At a
            // saved version the extents are learned a window at a time, so that the next reads
            // nearby (random ones too) need only their chunks.
            let first = max(0, offset - longestExtent + 1)
            let through = version == nil ? end : min(record.size, max(end, offset + Self.learnedWindow))
            let all = try Self.extents(tx, node: node, lineage: lineage, starts: first...(through - 1))
            let sorted = all.sorted { $0.key < $1.key }.map { (start: $0.key, extent: $0.value) }
            let learned = PinnedFile(size: record.size, covered: first..<through, extents: sorted)
            guard let overlapping = learned.extents(overlapping: offset, end, longest: longestExtent) else {
                throw DocumentStoreError.corrupt(
                    path: location, reason: "the extents of \(node) cannot be read")
            }
            let chunks = try self.chunks(tx, Set(overlapping.map(\.extent.chunk)))
            if let version { pinned.withLock { $0.learn(PinnedKey(node: node, version: version), learned) } }
            return try assemble(offset: offset, end: end, extents: overlapping, chunks: chunks)
        }
        if let linked {
            guard linked != node else {
                throw DocumentStoreError.corrupt(path: location, reason: "hard link \(node) names itself")
            }
            return try readContents(of: linked, at: version, offset: offset, count: count)
        }
        return data
    }

    /// Bytes of extent starts a first read at a saved version learns (256 MiB).
    static let learnedWindow: Int64 = 256 << 20

    /// No extent is longer than the store's chunk size: fixed chunks were that long, and
    /// content-defined ones are at most that long.
    var longestExtent: Int64 { Int64(chunkSize) }

    /// A read from what earlier reads at a saved version learned (`entry`, as it was before this
    /// read): from the chunk cache (without the database), else with one read of the missing
    /// chunks; nil if the extents are not known.
    private func pinnedRead(_ entry: PinnedFile, offset: Int64, count: Int) throws -> Data? {
        let end = min(entry.size, Self.end(offset, count))
        guard offset < end else { return Data() }
        guard let overlapping = entry.extents(overlapping: offset, end, longest: longestExtent) else {
            return nil
        }
        var chunks: [Int64: Data] = [:]
        var missing: Set<Int64> = []
        cache.withLock { cache in
            for item in overlapping {
                if let data = cache.get(item.extent.chunk) {
                    chunks[item.extent.chunk] = data
                } else {
                    missing.insert(item.extent.chunk)
                }
            }
        }
        if !missing.isEmpty, end - offset <= Int64(chunkSize) / 8, offset != entry.lastEnd {
            var sliced = Data(count: Int(end - offset))
            if try sliced.withUnsafeMutableBytes({ try directRead(entry, offset: offset, into: $0) }) != nil {
                return sliced
            }
        }
        if !missing.isEmpty {
            // Chunks never change, so they need no snapshot; one the retention policy collected
            // since is missing, and the full read says what became of the version.
            let fetched = try directChunks(missing) ?? backend.access { tx in try self.chunks(tx, missing) }
            guard missing.allSatisfy({ fetched[$0] != nil }) else { return nil }
            chunks.merge(fetched) { old, _ in old }
        }
        return try? assemble(offset: offset, end: end, extents: overlapping, chunks: chunks)
    }

    /// ``pinnedRead(_:offset:count:)`` into `buffer` where every chunk the read needs is cached,
    /// or it is a small read away from the last one (a random read) and the backend reads the
    /// slices of the chunks it lacks, not whole (sequential readers read and cache whole
    /// chunks); nil otherwise (`buffer` may then hold some of the bytes).
    private func directRead(_ entry: PinnedFile, offset: Int64, into buffer: UnsafeMutableRawBufferPointer)
        throws
        -> Int?
    {
        let end = min(entry.size, Self.end(offset, buffer.count))
        guard offset < end else { return 0 }
        guard let base = buffer.baseAddress,
            let overlapping = entry.indices(overlapping: offset, end, longest: longestExtent)
        else { return nil }
        let random = end - offset <= Int64(chunkSize) / 8 && offset != entry.lastEnd
        var cursor = offset
        for index in overlapping {
            let (start, extent) = entry.extents[index]
            let from = max(cursor, start)
            let to = min(end, start + extent.length)
            guard from < to else { continue }
            if from > cursor { memset(base + Int(cursor - offset), 0, Int(from - cursor)) }
            let target = UnsafeMutableRawBufferPointer(
                rebasing: buffer[Int(from - offset)..<Int(to - offset)])
            let within = Int(from - start)..<Int(to - start)
            if let chunk = cache.withLock({ $0.get(extent.chunk) }) {
                guard within.upperBound <= chunk.count else { return nil }
                chunk.withUnsafeBytes { bytes in
                    target.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[within]))
                }
            } else {
                guard random, try backend.chunkSlice(extent.chunk, within, into: target) else { return nil }
                counters.withLock {
                    $0.chunksRead += 1
                    $0.bytesRead += Int64(within.count)
                }
            }
            cursor = to
        }
        if cursor < end { memset(base + Int(cursor - offset), 0, Int(end - cursor)) }
        return Int(end - offset)
    }

    /// The bytes `offset..<end` of a file from the extents that overlap them; zeros elsewhere.
    private func assemble(
        offset: Int64, end: Int64, extents: [(start: Int64, extent: Extent)], chunks: [Int64: Data]
    ) throws -> Data {
        // Appended in order, with zeros only for holes: a buffer zeroed first and then
        // overwritten cost a twelfth of a random write's CPU (each takes its page in).
        var result = Data(capacity: Int(end - offset))
        var cursor = offset
        for (start, extent) in extents.sorted(by: { $0.start < $1.start }) {
            guard let chunk = chunks[extent.chunk] else {
                throw DocumentStoreError.corrupt(path: location, reason: "chunk \(extent.chunk) is missing")
            }
            let from = max(cursor, start)
            let to = min(end, start + min(extent.length, Int64(chunk.count)))
            guard from < to else { continue }
            if from > cursor { result.append(Data(count: Int(from - cursor))) }
            result.append(chunk[chunk.startIndex + Int(from - start)..<chunk.startIndex + Int(to - start)])
            cursor = to
        }
        if cursor < end { result.append(Data(count: Int(end - cursor))) }
        return result
    }

    /// The extents of `node` as of `lineage` that begin in `starts`; removals are left out.
    static func extents(
        _ tx: any StoreTransaction, node: StoreNodeID, lineage: Lineage, starts: ClosedRange<Int64>
    )
        throws -> [Int64: Extent]
    {
        var map = try tx.extents(node, branch: 0, upTo: lineage.limit, starts: starts)
        if lineage.branch != 0 {
            map.merge(try tx.extents(node, branch: lineage.branch, upTo: .max, starts: starts)) { _, new in
                new
            }
        }
        return map.compactMapValues { $0 }
    }

    /// Chunks' bytes by id read by the backend outside any transaction (counted and cached as
    /// ``chunks(_:_:)`` does); nil where it cannot.
    private func directChunks(_ ids: Set<Int64>) throws -> [Int64: Data]? {
        guard let fetched = try backend.wholeChunks(ids.sorted()) else { return nil }
        cache.withLock { cache in for (id, data) in fetched { cache.put(id, data) } }
        counters.withLock {
            $0.chunksRead += fetched.count
            $0.bytesRead += fetched.values.reduce(0) { $0 + Int64($1.count) }
        }
        return fetched
    }

    /// Chunks' bytes by id, from the cache or the database (counted).
    func chunks(_ tx: any StoreTransaction, _ ids: Set<Int64>) throws -> [Int64: Data] {
        var result: [Int64: Data] = [:]
        var missing: [Int64] = []
        cache.withLock { cache in
            for id in ids {
                if let data = cache.get(id) { result[id] = data } else { missing.append(id) }
            }
        }
        guard !missing.isEmpty else { return result }
        let fetched = try tx.chunks(missing.sorted())
        var read = (chunks: 0, bytes: Int64(0))
        for (id, data) in fetched {
            result[id] = data
            read.chunks += 1
            read.bytes += Int64(data.count)
        }
        cache.withLock { cache in for (id, data) in fetched { cache.put(id, data) } }
        counters.withLock {
            $0.chunksRead += read.chunks
            $0.bytesRead += read.bytes
        }
        return result
    }

    func chunk(_ tx: any StoreTransaction, _ id: Int64) throws -> Data {
        guard let data = try chunks(tx, [id])[id] else {
            throw DocumentStoreError.corrupt(path: location, reason: "chunk \(id) is missing")
        }
        return data
    }

    /// Makes every save this store committed before the call durable. A durable commit covers
    /// the deferred ones before it (the log is flushed up to it), so only deferred commits since
    /// the last durable one or sync cost a sync.
    public func synchronize() throws {
        let target = durability.withLock { $0.deferred }
        guard durability.withLock({ $0.covered < target }) else { return }
        try backend.synchronize()
        durability.withLock { $0.covered = max($0.covered, target) }
    }

    /// A write transaction through the backend, counted for ``synchronize()``.
    func write<T>(durable: Bool, counted: Bool = true, _ body: (any StoreTransaction) throws -> T) throws -> T
    {
        // Deferred commits finished before this one starts are in the log ahead of it.
        let before = durability.withLock { $0.deferred }
        let result = try backend.write(durable: durable, body)
        durability.withLock { ledger in
            if durable { ledger.covered = max(ledger.covered, before) } else { ledger.deferred += 1 }
        }
        if counted { counters.withLock { $0.transactionsCommitted += 1 } }
        return result
    }

    /// Drops cached chunks and learned chunk maps (for tests and benchmarks of cold reads).
    public func purgeCache() {
        cache.withLock { $0.removeAll() }
        pinned.withLock { $0.removeAll() }
    }

    // MARK: Saving

    public func makeNodeIDs(count: Int) throws -> [StoreNodeID] {
        guard count > 0 else { return [] }
        let first = try write(durable: true, counted: false) { tx in try tx.reserveNodeIDs(count: count) }
        return (0..<Int64(count)).map { StoreNodeID(rawValue: first + $0) }
    }

    public func save(_ changes: DocumentChanges) throws -> SaveResult {
        // Outside the transaction, which saves of other documents wait for.
        let precut = try precut(changes)
        var carried: [CarriedExtents] = []
        let result = try write(durable: changes.durable) { tx in
            carried = []
            return try self.save(tx, changes, event: nil, precut: precut, carried: &carried)
        }
        if !carried.isEmpty { pinned.withLock { files in for file in carried { files.carry(file) } } }
        return result
    }

    /// One save inside a write transaction; `event` overrides the recorded event's kind;
    /// `precut` holds new contents already cut and hashed. `carried` gets the files whose
    /// extents at the new version follow from those at the current one, for the reads at
    /// that version to know them once the transaction commits.
    func save(
        _ tx: any StoreTransaction, _ changes: DocumentChanges, event: StoreEvent.Kind?,
        precut: [StoreNodeID: Precut] = [:], carried: inout [CarriedExtents]
    ) throws -> SaveResult {
        let document = try Self.fetchDocument(tx, changes.document)
        var conflict = false
        var changes = changes
        if changes.base != document.currentVersion {
            switch changes.conflictPolicy {
            case .fail:
                throw DocumentStoreError.conflict(
                    document: document.id, base: changes.base, current: document.currentVersion)
            case .keepBoth:
                conflict = true
            case .rebaseIfDisjoint:
                if let rebased = try rebased(tx, changes, document: document) {
                    changes = rebased
                } else {
                    conflict = true
                }
            }
        }
        let now = Timestamp.now
        let version = try tx.insertVersion(
            document: document.id, base: changes.base, origin: changes.origin, created: now)
        let branch: Int64 = conflict ? version.rawValue : 0
        if conflict { try tx.updateVersion(version, .conflict) }
        // The state the changes apply to: the base for a conflict, else the current version.
        let before = conflict ? Lineage(limit: changes.base.rawValue, branch: 0) : Lineage.current
        var written = (chunks: 0, bytes: Int64(0), nodes: 0)

        var records: [StoreNodeID: NodeRecord] = [:]
        for record in changes.nodes {
            guard record.document == document.id else {
                throw DocumentStoreError.invalidChange("\(record.id) belongs to another document")
            }
            records[record.id] = record
        }
        for (id, update) in changes.contents.sorted(by: { $0.key < $1.key }) {
            let previous = try Self.node(tx, id, lineage: before)
            guard var record = records[id] ?? previous else { throw DocumentStoreError.noSuchNode(id) }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(id) }
            guard record.linkOf == nil else {
                throw DocumentStoreError.invalidChange(
                    "\(id) is a hard link: its contents are those of \(record.linkOf.map { "\($0)" } ?? "")")
            }
            let writer = ContentWriter(
                store: self, tx: tx, node: id,
                previousSize: previous?.kind == .regularFile ? previous?.size : nil,
                lineage: before, branch: branch, version: version,
                precut: precut[id] ?? finishedPreparation(of: update))
            let result = try writer.write(update)
            if !conflict, changes.base == document.currentVersion {
                carried.append(
                    CarriedExtents(
                        node: id, from: document.currentVersion, to: version, size: result.size,
                        rows: result.rows))
            }
            record.size = result.size
            written.chunks += result.chunks
            written.bytes += result.bytes
            records[id] = record
        }
        // What this save removes: the listed wrappers and their subtrees as they were before,
        // except wrappers the save keeps (moved out of a removed folder in the same save).
        var removed: [StoreNodeID: NodeRecord] = [:]
        if !changes.removedNodes.isEmpty {
            if let kept = changes.removedNodes.first(where: { records[$0] != nil }) {
                throw DocumentStoreError.invalidChange("\(kept) is both changed and removed")
            }
            // Removing files and links touches only them; the whole tree is read (to find
            // subtrees) only when a folder goes.
            var listed: [StoreNodeID: NodeRecord] = [:]
            for id in changes.removedNodes {
                if id == document.root {
                    throw DocumentStoreError.invalidChange("the document's root cannot be removed")
                }
                if let record = try Self.node(tx, id, lineage: before), record.document == document.id {
                    listed[id] = record
                }
            }
            if !listed.values.contains(where: { $0.kind == .directory }) {
                removed = listed
            } else {
                let all = try Self.nodes(tx, document: document.id, lineage: before)
                var children: [StoreNodeID: [StoreNodeID]] = [:]
                for record in all.values {
                    if let parent = record.parent { children[parent, default: []].append(record.id) }
                }
                var frontier = changes.removedNodes
                var seen: Set<StoreNodeID> = []
                while let next = frontier.popLast() {
                    guard seen.insert(next).inserted, records[next] == nil else { continue }
                    if let record = all[next] { removed[next] = record }
                    frontier += children[next] ?? []
                }
            }
        }
        try validate(tx, records: records, removed: Set(removed.keys), document: document, lineage: before)
        for record in records.values.sorted(by: { $0.id < $1.id }) {
            try tx.insertNode(StoredNode(record: record.at(version), branch: branch, removed: false))
            written.nodes += 1
        }
        for record in removed.values.sorted(by: { $0.id < $1.id }) {
            try tx.insertNode(StoredNode(record: record.at(version), branch: branch, removed: true))
            written.nodes += 1
        }
        let info = try tx.updateVersion(version, .bytesWritten(written.bytes))
        if !conflict { try tx.updateDocument(document.id, .currentVersion(version, modified: now)) }
        try tx.insertEvent(
            event ?? (conflict ? .conflict : .saved), document: document.id, version: version,
            name: document.name,
            origin: changes.origin, time: now)
        counters.withLock {
            $0.chunksWritten += written.chunks
            $0.bytesWritten += written.bytes
            $0.nodesWritten += written.nodes
        }
        return SaveResult(
            version: info, chunksWritten: written.chunks, bytesWritten: written.bytes,
            nodesWritten: written.nodes,
            rebasedOnto: !conflict && changes.base != document.currentVersion ? document.currentVersion : nil)
    }

    /// `changes` applied on top of the document's current version instead of their older base,
    /// or nil when they must be kept as a conflict: when a wrapper they touch changed since the
    /// base, or when the tree they would make is not valid (a name taken meanwhile, a parent
    /// removed). A folder whose only change here is its times (a name made or taken in it)
    /// merges: its current record with the later of each time, so two writers can add files
    /// to one folder at once.
    private func rebased(_ tx: any StoreTransaction, _ changes: DocumentChanges, document: DocumentInfo)
        throws -> DocumentChanges?
    {
        let base = Lineage(limit: changes.base.rawValue, branch: 0)
        let removed = Set(changes.removedNodes)
        var result = changes
        let touched = Set(changes.nodes.map(\.id) + changes.removedNodes + Array(changes.contents.keys))
        for id in touched.sorted() where try tx.nodeChanged(id, after: changes.base) {
            guard let index = result.nodes.firstIndex(where: { $0.id == id }), !removed.contains(id),
                changes.contents[id] == nil
            else { return nil }
            let mine = result.nodes[index]
            guard mine.kind == .directory, let before = try Self.node(tx, id, lineage: base),
                mine.sameExceptTimes(before), let current = try Self.node(tx, id, lineage: .current),
                current.kind == .directory
            else { return nil }
            result.nodes[index] = current.withLaterTimes(of: mine)
        }
        var records: [StoreNodeID: NodeRecord] = [:]
        for record in result.nodes { records[record.id] = record }
        do {
            try validate(tx, records: records, removed: removed, document: document, lineage: .current)
        } catch DocumentStoreError.invalidChange {
            return nil
        }
        return result
    }

    /// Checks that changed records form a valid tree: parents exist and are directories, names are
    /// valid and unique among siblings.
    private func validate(
        _ tx: any StoreTransaction, records: [StoreNodeID: NodeRecord], removed: Set<StoreNodeID>,
        document: DocumentInfo, lineage: Lineage
    ) throws {
        var names: [StoreNodeID: [String: StoreNodeID]] = [:]
        for record in records.values.sorted(by: { $0.id < $1.id }) {
            if record.id == document.root {
                guard record.parent == nil else {
                    throw DocumentStoreError.invalidChange("the root cannot move")
                }
                continue
            }
            if let reason = FileName.problem(with: record.name) {
                throw DocumentStoreError.invalidName(record.name, reason: reason)
            }
            guard let parentID = record.parent else {
                throw DocumentStoreError.invalidChange("\(record.id) has no parent")
            }
            guard !removed.contains(parentID),
                let parent = try records[parentID] ?? Self.node(tx, parentID, lineage: lineage),
                parent.document == document.id, parent.kind == .directory
            else {
                throw DocumentStoreError.invalidChange(
                    "the parent of \(record.name.debugDescription) is not a directory")
            }
            if record.kind == .symbolicLink && record.linkTarget == nil {
                throw DocumentStoreError.invalidChange(
                    "link \(record.name.debugDescription) has no destination")
            }
            if let target = record.linkOf {
                // A hard link names a file of this document that is not itself a link, and
                // stays of its kind.
                guard target != record.id, !removed.contains(target),
                    let file = try records[target] ?? Self.node(tx, target, lineage: lineage),
                    file.document == document.id, file.linkOf == nil, file.kind != .directory,
                    file.parent != nil
                else {
                    throw DocumentStoreError.invalidChange(
                        "hard link \(record.name.debugDescription) does not name a file of its document")
                }
                guard record.kind == file.kind else {
                    throw DocumentStoreError.invalidChange(
                        "hard link \(record.name.debugDescription) is not of its file's kind")
                }
            }
            if record.device != 0 && record.kind != .characterDevice && record.kind != .blockDevice {
                throw DocumentStoreError.invalidChange(
                    "\(record.name.debugDescription) has a device number but is not a device")
            }
            // Another live wrapper with this name in this parent?
            let named = try tx.nodesNamed(
                record.name, in: parentID, except: record.id, branch: lineage.branch, upTo: lineage.limit)
            for candidate in named where !removed.contains(candidate) {
                let current = try records[candidate] ?? Self.node(tx, candidate, lineage: lineage)
                if let current, current.parent == parentID, current.name == record.name {
                    throw DocumentStoreError.invalidChange(
                        "\(record.name.debugDescription) already exists in its directory")
                }
            }
            if names[parentID, default: [:]].updateValue(record.id, forKey: record.name) != nil {
                throw DocumentStoreError.invalidChange(
                    "two wrappers named \(record.name.debugDescription) in one directory")
            }
        }
    }

    // MARK: Versions

    public func versions(of document: DocumentID) throws -> [VersionInfo] {
        try backend.read { tx in
            _ = try Self.fetchDocument(tx, document)
            return try tx.versions(of: document)
        }
    }

    public func restore(_ version: VersionID, of document: DocumentID, origin: String) throws -> SaveResult {
        try write(durable: true) { tx in try restore(tx, version, of: document, origin: origin) }
    }

    func restore(_ tx: any StoreTransaction, _ version: VersionID, of document: DocumentID, origin: String)
        throws -> SaveResult
    {
        guard let info = try tx.version(version), info.document == document else {
            throw DocumentStoreError.noSuchVersion(version)
        }
        let doc = try Self.fetchDocument(tx, document)
        let targetLineage = try Lineage.of(tx, version)
        let target = try Self.nodes(tx, document: document, lineage: targetLineage)
        let current = try Self.nodes(tx, document: document, lineage: .current)
        var changes = DocumentChanges(document: document, base: doc.currentVersion)
        changes.origin = origin
        changes.conflictPolicy = .fail
        for (id, record) in target {
            var unchanged = record
            unchanged.version = current[id]?.version ?? unchanged.version
            if current[id] != unchanged { changes.nodes.append(record) }
            guard record.kind == .regularFile, record.linkOf == nil else { continue }
            // Only files whose extents differ change: a restore costs the change.
            if let now = current[id], now.kind == .regularFile, now.size == record.size {
                let all = 0...Int64.max
                let then = try Self.extents(tx, node: id, lineage: targetLineage, starts: all)
                if then == (try Self.extents(tx, node: id, lineage: .current, starts: all)) { continue }
            }
            changes.contents[id] = .copy(of: NodeLookup(id, at: version))
        }
        changes.removedNodes = current.keys.filter { target[$0] == nil }.sorted()
        var carried: [CarriedExtents] = []
        return try self.save(tx, changes, event: .restored, carried: &carried)
    }

    public func resolveConflict(_ version: VersionID) throws {
        try write(durable: true) { tx in try Self.resolveConflict(tx, version) }
    }

    static func resolveConflict(_ tx: any StoreTransaction, _ version: VersionID) throws {
        guard let info = try tx.version(version) else { throw DocumentStoreError.noSuchVersion(version) }
        guard info.isConflict, !info.isResolved else { return }  // FV-2: not a conflict, or resolved
        try tx.updateVersion(version, .resolved)
        let document = try Self.fetchDocument(tx, info.document)
        try tx.insertEvent(
            .resolved, document: info.document, version: version, name: document.name, origin: "resolve",
            time: .now)
    }

    public func unresolvedConflicts() throws -> [VersionInfo] {
        try backend.access { try $0.unresolvedConflicts() }
    }

    // MARK: Events

    public func events(after sequence: Int64) throws -> [StoreEvent] {
        try backend.access { try $0.events(after: sequence) }
    }

    public func latestEventSequence() throws -> Int64 {
        try backend.access { try $0.latestEventSequence() }
    }

    // MARK: Helpers shared with the retention and integrity code

    /// Versions that garbage collection just dropped must not be read from memory afterwards.
    func forgetPinnedReads(at versions: Set<VersionID>) {
        guard !versions.isEmpty else { return }
        pinned.withLock { $0.forget(versions) }
    }

    func count(_ update: (inout StoreStatistics) -> Void) { counters.withLock { update(&$0) } }

    package static func hash(_ data: Data) -> Data { SHA256.hash(data) }

    package static func hash(_ bytes: UnsafeRawBufferPointer) -> Data { SHA256.hash(bytes) }

    /// Whether every byte is zero: such a chunk is stored as a hole.
    package static func isZero(_ data: Data) -> Bool { data.withUnsafeBytes { isZero($0) } }

    /// Whether every byte is zero.
    package static func isZero(_ raw: UnsafeRawBufferPointer) -> Bool {
        var words = raw.count / 8
        var index = 0
        while words > 0 {
            if raw.loadUnaligned(fromByteOffset: index, as: UInt64.self) != 0 { return false }
            index += 8
            words -= 1
        }
        while index < raw.count {
            if raw[index] != 0 { return false }
            index += 1
        }
        return true
    }
}

/// Which rows make up a version: the main line up to `limit`, plus a conflict branch on top.
struct Lineage: Sendable {
    var limit: Int64
    var branch: Int64

    static let current = Lineage(limit: .max, branch: 0)

    static func of(_ tx: any StoreTransaction, _ version: VersionID?) throws -> Lineage {
        guard let version else { return .current }
        guard let info = try tx.version(version) else { throw DocumentStoreError.noSuchVersion(version) }
        return of(info)
    }

    private static func of(_ info: VersionInfo) -> Lineage {
        if !info.isConflict { return Lineage(limit: info.id.rawValue, branch: 0) }
        return Lineage(limit: info.base?.rawValue ?? 0, branch: info.id.rawValue)
    }

    /// The lineage that reads `node` as of `version`, which retention may have dropped: a node
    /// that no version since changed still reads, from the same rows as at its document's current
    /// version (every change of a file's bytes writes its record again, so none of its rows is
    /// newer than its record). A mount opens a file at its record's version, and `docfs gc`
    /// drops versions whose records stay current: without this, such files failed to read
    /// (ESTALE) in the next mount. The lineage stops at `version`, so that a save reading it
    /// (a copy) does not see what the save itself wrote. A version past the document's current
    /// one was never made, and is no such version.
    static func of(_ tx: any StoreTransaction, _ version: VersionID?, reading node: StoreNodeID) throws
        -> Lineage
    {
        guard let version else { return .current }
        if let info = try tx.version(version) { return of(info) }
        let atVersion = Lineage(limit: version.rawValue, branch: 0)
        if let then = try VersionedStore.node(tx, node, lineage: atVersion),
            let document = try tx.document(then.document),
            version.rawValue <= document.currentVersion.rawValue,
            let now = try VersionedStore.node(
                tx, node, lineage: Lineage(limit: document.currentVersion.rawValue, branch: 0)),
            now.version == then.version
        {
            return atVersion
        }
        throw DocumentStoreError.noSuchVersion(version)
    }
}

extension NodeRecord {
    /// The record as the row of `version` stores it.
    func at(_ version: VersionID) -> NodeRecord {
        var record = self
        record.version = version
        if record.kind != .regularFile { record.size = 0 }
        if record.preferredName == record.name { record.preferredName = nil }
        record.permissions &= 0o7777
        return record
    }
}
