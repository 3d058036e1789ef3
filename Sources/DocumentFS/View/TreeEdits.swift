import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import VersionedStore

extension MountRoom {
    /// Fails for a name longer than any this file system holds (NAME_MAX, 255 bytes): a lookup,
    /// removal or rename of one is ENAMETOOLONG, as on ext4, not ENOENT.
    func checkLength(_ name: FUSE.FileName) throws(Errno) {
        guard name.bytes.count <= 255 else { throw .fileNameTooLong }
    }

    /// Checks a new name: the store keeps names as UTF-8 text of at most 255 bytes.
    func validate(_ name: FUSE.FileName) throws(Errno) -> String {
        try checkLength(name)
        guard !name.bytes.isEmpty, !name.isDotOrDotDot, !name.bytes.contains(0x2F) else {
            throw .invalidArgument
        }
        guard let text = String(validating: name.bytes, as: UTF8.self) else { throw .illegalByteSequence }
        return text
    }

    /// Fails if `directory` has a child whose name is the same text in another Unicode form: the
    /// store compares names as text, so both could not be saved. One lookup, whatever the size of
    /// the directory.
    func checkNoEquivalent(_ text: String, in children: Children, except: ViewNode? = nil) throws(Errno) {
        guard let other = children.entry(equivalentTo: text), other !== except else { return }
        if !other.name.bytes.elementsEqual(text.utf8) { throw .fileExists }
    }

    /// Fails as `rename(2)` does when `target`, the name a rename goes to, cannot be replaced by
    /// something of `kind`: a folder only by a folder, and only when empty.
    func checkReplaceable(_ target: ViewNode, by kind: FileWrapper.Kind) throws(Errno) {
        if kind == .directory && target.kind != .directory { throw .notDirectory }
        if kind != .directory && target.kind == .directory { throw .isDirectory }
        if target.kind == .directory && !target.children.isEmpty { throw .directoryNotEmpty }
    }

    /// Whether the document's node was renamed away under a scratch name.
    func isHidden(_ node: ViewNode, of document: DocumentState) -> Bool {
        node.name.string != document.info.name
    }

    /// The name a file's node moves to when it leaves its own: a saved one first.
    func heir(of file: ViewNode) -> ViewNode? {
        let names = file.aliases.values.sorted { $0.storeID < $1.storeID }
        return names.first { isPersisted($0) } ?? names.first
    }

    /// Takes the name `entry` out of its directory, as `unlink` or a rename over it does. A file
    /// with other names keeps its node: it moves to one of them, so its inode and contents stay.
    func unlinkName(_ state: inout State, _ entry: ViewNode) {
        if let file = entry.linkOf {
            file.aliases[ObjectIdentifier(entry)] = nil
            file.record.changed = .now
            changed(&state, file)
            detach(&state, entry)
            return
        }
        guard let heir = heir(of: entry), let place = heir.parent, let from = entry.parent else {
            detach(&state, entry)
            return
        }
        entry.aliases[ObjectIdentifier(heir)] = nil
        heir.linkOf = nil
        detach(&state, heir)
        if from.children[entry.name] === entry { from.children[entry.name] = nil }
        let now = Timestamp.now
        from.record.modified = now
        from.record.changed = now
        changed(&state, from)
        entry.name = heir.name
        entry.parent = place
        entry.record.name = heir.record.name
        entry.record.parent = place.persistAs
        entry.record.changed = now
        place.children[heir.name] = entry
        changed(&state, place)
        changed(&state, entry)
    }

    /// Whether the node is a file under a scratch name (never saved).
    func isScratch(_ node: ViewNode) -> Bool {
        node.kind != .directory && configuration.scratchNames.matches(node.name)
    }

    /// Takes `node` out of the tree; open handles keep it alive.
    func detach(_ state: inout State, _ node: ViewNode) {
        node.linked = false
        if node.atMountRoot {
            if state.rootEntries[node.name] === node { state.rootEntries[node.name] = nil }
            state.rootChanged = .now
        } else if let parent = node.parent {
            if parent.children[node.name] === node { parent.children[node.name] = nil }
            let now = Timestamp.now
            parent.record.modified = now
            parent.record.changed = now
            if !isScratch(node) { changed(&state, parent) }
        }
        changed(&state, node)
        func release(_ n: ViewNode) {
            n.linked = false
            if n.openHandles == 0 && table.node(for: n.ino) == nil { state.nodes[n.ino] = nil }
            for child in n.children.values { release(child) }
        }
        release(node)
    }

    /// Records that `node` changed: its document has something to save.
    func changed(_ state: inout State, _ node: ViewNode) {
        guard let document = document(&state, of: node) else { return }
        document.dirty = true
        document.lastChange = .now
        document.touched[ObjectIdentifier(node)] = node
    }

    /// A move's changes to `destination` that take away `target`, the name it replaces: a file
    /// with other names keeps its node under one of them.
    func replacing(_ target: ViewNode?, in destination: DocumentState) -> DocumentChanges {
        var changes = DocumentChanges(document: destination.id, base: destination.base)
        changes.origin = origin
        changes.conflictPolicy = .rebaseIfDisjoint
        guard let target else { return changes }
        if target.linkOf == nil, let heir = heir(of: target),
            var record = destination.committed?[target.persistAs]
        {
            record.parent = heir.parent?.persistAs
            record.name = heir.name.string
            changes.nodes.append(record)
            changes.removedNodes.append(heir.persistAs)
        } else {
            changes.removedNodes.append(target.persistAs)
        }
        return changes
    }

    /// A new document named `name` whose root is of `root`'s kind, made in `tx`, and the changes
    /// that fill it in.
    func createDocument(_ tx: any DocumentStoreTransaction, like root: NodeRecord, named name: String) throws
        -> (DocumentInfo, DocumentChanges)
    {
        let info = try tx.createDocument(
            named: name,
            root: DocumentRoot(
                kind: root.kind, permissions: root.permissions, linkTarget: root.linkTarget,
                device: root.device),
            type: nil, origin: origin)
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.origin = origin
        changes.conflictPolicy = .fail
        return (info, changes)
    }
}

extension DocumentStoreTransaction {
    /// Saves `changes` as a new current version, or throws ``DocumentStoreError/conflict`` (and
    /// the transaction commits nothing) where they would only be kept as a conflict version: a
    /// move must land on both sides or on neither.
    func saveOnTop(_ changes: DocumentChanges) throws -> SaveResult {
        let result = try save(changes)
        if result.isConflict {
            throw DocumentStoreError.conflict(
                document: changes.document, base: changes.base, current: result.version.id)
        }
        return result
    }
}
