import DocumentEngine
import FUSE
import Foundation
import Synchronization
import SystemPackage
import VersionedStore

/// An unresolved conflict version of a document (a save that lost to another one, FV-1), shown
/// at the mount root beside the document as `name (conflict N).ext`, read-only.
///
/// - Open it to compare: its files read the conflict version's bytes.
/// - Remove it (`rm`, `rm -r`) to resolve the conflict and keep the current version; the
///   conflict version stays in the history (`docfs versions`) until retention drops it.
/// - Rename it onto the document's name (`mv "name (conflict N).ext" name.ext`) to keep it: the
///   conflict version becomes the current one (a new save; the mount's own unsaved changes are
///   saved first, so nothing is lost) and the conflict is resolved.
/// - Renaming it to another name keeps both: the conflict version becomes a new document of that
///   name at the root, or wrappers of that name in a package, and the conflict is resolved, in
///   one store transaction.
///   Removing files inside it only hides them in this mount; nothing else inside can change
///   (`EACCES`), and its files are shown without write permission.
final class ConflictEntry {
    let version: VersionInfo
    /// The node at the mount root; its tree is read on first use.
    let root: ViewNode
    var isLoaded = false

    init(version: VersionInfo, root: ViewNode) {
        self.version = version
        self.root = root
    }
}

extension MountRoom {
    /// The name of a conflict entry: ` (conflict N)` before the document name's extension, the
    /// stem shortened to keep within 255 bytes.
    static func conflictName(_ name: String, version: VersionID) -> String {
        let mark = " (conflict \(version.rawValue))"
        var stem = Substring(name)
        var suffix = Substring("")
        if let dot = name.lastIndex(of: "."), dot != name.startIndex, name.index(after: dot) != name.endIndex,
            name[dot...].utf8.count <= 32
        {
            stem = name[..<dot]
            suffix = name[dot...]
        }
        while stem.utf8.count + mark.utf8.count + suffix.utf8.count > 255, !stem.isEmpty {
            stem.removeLast()
        }
        return String(stem) + mark + String(suffix)
    }

    /// A conflict node's inode number: deterministic (the same after a remount), with bit 62 set
    /// so that it is never a store node's (store id plus one).
    func conflictInode(_ state: inout State, version: VersionID, node: StoreNodeID) -> UInt64 {
        let v = UInt64(bitPattern: version.rawValue)
        let n = UInt64(bitPattern: node.rawValue)
        if v < 1 << 29, n < 1 << 32 {
            return 1 << 62 | v << 32 | n
        }
        // Ids too large to pack (never in practice): numbers of their own, above the packed ones.
        state.nextConflictInode &+= 1
        return 3 << 61 | state.nextConflictInode
    }

    /// A conflict version's node: its record read-only, the document none (nothing saves it).
    func makeConflictNode(_ state: inout State, version: VersionID, record: NodeRecord, name: FUSE.FileName)
        -> ViewNode
    {
        var shown = record
        // Files are read-only; folders keep their modes, so that their owner can `rm -r` them.
        if record.kind == .regularFile { shown.permissions &= ~0o222 }
        let ino = conflictInode(&state, version: version, node: record.id)
        let node = ViewNode(
            storeID: record.id, document: nil, name: name, record: shown, conflict: (version, ino))
        if record.kind == .regularFile {
            node.contents = FileContents(
                base: ContentBase(node: record.id, version: record.version, size: record.size),
                spill: spillFiles)
        }
        state.nodes[ino] = node
        return node
    }

    /// The store's unresolved conflicts, with the root records of those the mount does not show
    /// yet. `roots` gives each document's root node.
    func fetchConflicts(roots: [DocumentID: StoreNodeID]) -> (
        versions: [VersionInfo], records: [VersionID: NodeRecord]
    )? {
        let versions: [VersionInfo]
        do {
            versions = try store.unresolvedConflicts()
        } catch {
            logger.warning("cannot list the store's conflicts: \(error)")
            return nil
        }
        let shown = state.withLock { Set($0.conflicts.keys) }
        var records: [VersionID: NodeRecord] = [:]
        let wanted = versions.compactMap { version in
            shown.contains(version.id) ? nil : roots[version.document].map { (version.id, $0) }
        }
        if !wanted.isEmpty, let found = try? store.nodes(wanted.map { NodeLookup($0.1, at: $0.0) }) {
            for ((version, _), result) in zip(wanted, found) {
                if case .success(let record?) = result { records[version] = record }
            }
        }
        return (versions, records)
    }

    /// Shows `versions` (every unresolved conflict) as entries at the mount root: adds new ones,
    /// renames those whose document was renamed, and drops the rest. A document, or any other
    /// entry, keeps its name: a conflict entry that would take it is not shown.
    func reconcileConflicts(
        _ state: inout State, versions: [VersionInfo], records: [VersionID: NodeRecord]
    ) -> [Notice] {
        var notices: [Notice] = []
        var wanted: [VersionID: (info: VersionInfo, name: FUSE.FileName)] = [:]
        for version in versions {
            guard let document = state.documents[version.document] else { continue }
            wanted[version.id] = (
                version, FUSE.FileName(Self.conflictName(document.info.name, version: version.id))
            )
        }
        for (id, entry) in state.conflicts {
            let shown = state.rootEntries[entry.root.name] === entry.root
            if let name = wanted[id]?.name, shown, name == entry.root.name { continue }
            if shown {
                state.rootEntries[entry.root.name] = nil
                notices.append(.delete(parent: mountRootInode, child: entry.root.ino, name: entry.root.name))
            }
            if let name = wanted[id]?.name, state.rootEntries[name] == nil {
                // Its document was renamed: the same entry under the new name.
                entry.root.name = name
                state.rootEntries[name] = entry.root
                notices.append(.entry(parent: mountRootInode, name: name))
            } else {
                dropConflict(&state, entry)
            }
        }
        for (id, want) in wanted where state.conflicts[id] == nil {
            guard let record = records[id], state.rootEntries[want.name] == nil else { continue }
            let root = makeConflictNode(&state, version: id, record: record, name: want.name)
            root.atMountRoot = true
            state.conflicts[id] = ConflictEntry(version: want.info, root: root)
            state.rootEntries[want.name] = root
            notices.append(.entry(parent: mountRootInode, name: want.name))
        }
        if !notices.isEmpty {
            state.rootChanged = .now
            notices.append(.inode(mountRootInode))
        }
        return notices
    }

    /// Forgets a conflict entry and its tree (open handles keep their nodes).
    func dropConflict(_ state: inout State, _ entry: ConflictEntry) {
        if state.rootEntries[entry.root.name] === entry.root { state.rootEntries[entry.root.name] = nil }
        // A listing of the store's conflicts taken before this drop (a resolve) would show the
        // entry again.
        state.rootGeneration &+= 1
        state.conflicts[entry.version.id] = nil
        func release(_ node: ViewNode) {
            node.linked = false
            if node.openHandles == 0 && table.node(for: node.ino) == nil && state.nodes[node.ino] === node {
                state.nodes[node.ino] = nil
            }
            for child in node.children.values { release(child) }
        }
        release(entry.root)
    }

    /// The conflict entry a node belongs to.
    func conflictEntry(_ state: inout State, of node: ViewNode) -> ConflictEntry? {
        // A history or Trash tree may show a conflict version too; it is not the entry.
        guard node.tree == nil else { return nil }
        return node.conflict.flatMap { state.conflicts[$0] }
    }
}
