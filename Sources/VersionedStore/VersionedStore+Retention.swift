import DocumentEngine
import Foundation

extension VersionedStore {
    /// A setting kept in the store (the retention policy), or nil.
    public func setting(_ key: String) throws -> String? {
        try backend.access { try $0.setting(key) }
    }

    public func setSetting(_ key: String, _ value: String) throws {
        try write(durable: true) { try $0.setSetting(key, value) }
    }

    /// Drops versions `policy` no longer keeps (never a document's current version, nor an
    /// unresolved conflict, nor a version in `protected`), removes deleted documents whose
    /// expiry has passed, deletes the rows and chunks nothing kept needs, and gives the space
    /// back.
    public func collectGarbage(_ policy: RetentionPolicy, protecting protected: Set<VersionID> = []) throws
        -> CollectionReport
    {
        let now = Timestamp.now
        var report = CollectionReport()
        let documents = try backend.access { tx in
            try tx.documents(deleted: false) + tx.documents(deleted: true)
        }
        // One transaction per document: writers wait for one document's clean-up, not the store's.
        for document in documents {
            let outcome = try write(durable: false) { tx -> (versions: [VersionID], removed: Bool) in
                guard let current = try tx.document(document.id) else { return ([], false) }
                if let deleted = current.deleted, policy.isExpired(deletedAt: deleted, now: now) {
                    let versions = try tx.versions(of: current.id).map(\.id)
                    try tx.removeDocument(current.id)
                    return (versions, true)
                }
                return (try Self.thin(tx, current, policy: policy, protected: protected, now: now), false)
            }
            // What reads at the kept versions learned stays true (they keep every row and chunk
            // they read), so a mount goes on serving what it read, also while a server is away;
            // a dropped version is not read from memory any more.
            forgetPinnedReads(at: Set(outcome.versions))
            if outcome.removed {
                report.documentsRemoved += 1
            } else {
                report.versionsRemoved += outcome.versions.count
            }
        }
        try write(durable: true) { tx in
            let freed = try tx.removeUnreferencedChunks()
            report.chunksRemoved = freed.count
            report.bytesFreed = freed.bytes
            try tx.removeEvents(before: Timestamp(rawValue: now.rawValue - 7 * 24 * 3600 * 1_000_000_000))
        }
        // What was dropped is dropped; giving its space back can wait for the next collection
        // (a busy server may time a long VACUUM out).
        try? backend.reclaimSpace()
        return report
    }

    /// Drops the versions of one document the policy does not keep, and every row no kept
    /// version reads; returns the versions that went.
    ///
    /// A row (of a wrapper, or of one chunk index) is read at version P when it is the newest row
    /// at or before P. So a row is needed when some kept version falls between it and the next row
    /// of the same key; a removal (or a hole) is needed only above a needed row it hides.
    static func thin(
        _ tx: any StoreTransaction, _ document: DocumentInfo, policy: RetentionPolicy,
        protected: Set<VersionID>,
        now: Timestamp
    ) throws -> [VersionID] {
        let versions = try tx.versions(of: document.id)
        let mainLine = versions.filter { !$0.isConflict }
        var keep = policy.versionsToKeep(mainLine.map { (id: $0.id, created: $0.created) }, now: now)
        keep.insert(document.currentVersion)
        keep.formUnion(protected.intersection(mainLine.map(\.id)))
        // Conflict versions: resolved ones go with their rows; unresolved ones read the main line
        // as of their base, which is then a read point like a kept version.
        var readPoints = Set(keep.map(\.rawValue))
        var dropped: [VersionID] = []
        for version in versions where version.isConflict {
            if version.isResolved && !protected.contains(version.id) {
                try tx.removeBranch(version.id.rawValue)
                dropped.append(version.id)
            } else {
                readPoints.insert(version.base?.rawValue ?? 0)
            }
        }
        dropped += mainLine.map(\.id).filter { !keep.contains($0) }
        guard !dropped.isEmpty else { return [] }
        let points = readPoints.sorted()

        /// Whether one of `points` (ascending) lies in `from..<to`.
        func isRead(_ points: [Int64], from: Int64, to: Int64) -> Bool {
            var low = 0
            var high = points.count
            while low < high {
                let middle = (low + high) / 2
                if points[middle] < from { low = middle + 1 } else { high = middle }
            }
            return low < points.count && points[low] < to
        }

        /// Of one key's rows (oldest first, with whether each holds something), those no read
        /// point in `points` needs.
        func unneeded<Key>(_ rows: [(key: Key, version: Int64, holds: Bool)], _ points: [Int64]) -> [Key] {
            var result: [Key] = []
            var keptBelow = false
            for (position, row) in rows.enumerated() {
                let next = position + 1 < rows.count ? rows[position + 1].version : .max
                let needed = isRead(points, from: row.version, to: next) && (row.holds || keptBelow)
                if needed { keptBelow = row.holds } else { result.append(row.key) }
            }
            return result
        }

        var nodeRows: [StoreNodeID: [(key: NodeRowKey, version: Int64, holds: Bool)]] = [:]
        for (key, removed) in try tx.nodeRowKeys(of: document.id) where key.branch == 0 {
            nodeRows[key.node, default: []].append((key, key.version.rawValue, !removed))
        }
        var goneNodes: [NodeRowKey] = []
        // The read points at which each wrapper exists: its contents matter only there.
        var livePoints: [StoreNodeID: [Int64]] = [:]
        for (node, unsorted) in nodeRows {
            let rows = unsorted.sorted { $0.version < $1.version }
            goneNodes += unneeded(rows, points)
            var live: [Int64] = []
            var position = -1
            for point in points {
                while position + 1 < rows.count && rows[position + 1].version <= point { position += 1 }
                if position >= 0 && rows[position].holds { live.append(point) }
            }
            livePoints[node] = live
        }
        var extentRows: [ExtentRowKey: [(key: ExtentRowKey, version: Int64, holds: Bool)]] = [:]
        for (key, hasChunk) in try tx.extentRowKeys(of: document.id) where key.branch == 0 {
            var slot = key
            slot.version = VersionID(rawValue: 0)
            extentRows[slot, default: []].append((key, key.version.rawValue, hasChunk))
        }
        var goneExtents: [ExtentRowKey] = []
        for (slot, rows) in extentRows {
            goneExtents += unneeded(rows.sorted { $0.version < $1.version }, livePoints[slot.node] ?? [])
        }
        try tx.removeExtentRows(goneExtents)
        try tx.removeNodeRows(goneNodes)
        try tx.removeVersions(dropped)
        return dropped
    }
}
