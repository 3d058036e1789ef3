import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import Threading
import VersionedStore

/// Following other processes' and other mounts' saves: store events, revalidation and reloads,
/// the kernel notices they send, and the root listing.
struct Reconciler: MountRoom {
    let view: MountView
}

extension Reconciler {
    /// Called on the observer's thread with other processes' (and our own) store events.
    func storeChanged(_ events: [StoreEvent]) {
        let foreign = events.filter { $0.origin != origin }
        // A conflict (ours included) or its resolution changes the conflict entries at the root.
        // A save of a document this mount does not show means that the listing that should have
        // brought it in failed or was dropped: list again rather than miss it until the next
        // create, rename or delete.
        let unknown = state.withLock { state in
            state.listed && foreign.contains { state.documents[$0.document] == nil }
        }
        if unknown || events.contains(where: { $0.kind != .saved }) {
            refreshListing()
        }
        for id in Set(foreign.map(\.document)) {
            guard let document = state.withLock({ $0.documents[id] }) else { continue }
            state.withLock { _ in document.needsReload = true }
            do {
                document.saving.lock()
                defer { document.saving.unlock() }
                try reloadLocked(document, force: false)
            } catch {
                logger.warning("cannot refresh \(document.info.name): \(error)")
            }
        }
    }

    /// Revalidates a node's document before an open (close-to-open consistency). Returns
    /// whether the document was behind the store's version (and reloaded, unless it has
    /// unsaved changes).
    @discardableResult
    func revalidate(_ node: ViewNode) throws(Errno) -> Bool {
        guard let document = state.withLock({ self.document(&$0, of: node) }) else { return false }
        let (base, loaded) = state.withLock { _ in (document.base, document.isLoaded) }
        guard loaded else { return false }
        let current: VersionID
        do {
            current = try store.currentVersion(of: document.id)
        } catch DocumentStoreError.io(let message) {
            // The store cannot be reached (a database server restarting, a network cut): serve
            // what this mount has, as a mount of a network store does; saves still fail with EIO.
            logger.warning("cannot revalidate \(document.info.name), serving it as last seen: \(message)")
            return false
        } catch {
            try storeCall { throw error }  // as the errno the caller should see
            return false
        }
        guard current != base else { return false }
        state.withLock { _ in document.needsReload = true }
        document.saving.lock()
        defer { document.saving.unlock() }
        // A reload that held the lock meanwhile (the observer's, of a version between) clears
        // the flag: still behind `current`, this one must load again.
        state.withLock { _ in if document.base != current { document.needsReload = true } }
        try reloadLocked(document, force: false)
        return true
    }

    /// Reads the document's current tree and shows it, unless the mount has unsaved changes
    /// (then the next save is applied on top, or kept as a conflict, and reloads after).
    /// The caller holds `document.saving`.
    func reloadLocked(_ document: DocumentState, force: Bool) throws(Errno) {
        let proceed = state.withLock { _ -> Bool in
            guard force || document.needsReload else { return false }
            return force || !(document.dirty || anyModified(document.root))
        }
        guard proceed else { return }
        let info = try storeCall { try store.document(document.id) }
        let loaded = state.withLock { _ in document.isLoaded }
        if !loaded {
            guard let root = try storeCall({ try store.node(info.root, at: info.currentVersion) }) else {
                return
            }
            let notices = state.withLock { _ -> [Notice] in
                document.base = info.currentVersion
                document.needsReload = false
                guard document.root.persistAs == root.id, !document.root.contentsModified,
                    !document.root.record.sameContent(as: root)
                        || document.root.contents?.base.version != root.version
                else { return [] }
                var updated = root
                updated.name = document.root.record.name
                document.root.record = updated
                let keptSize = document.root.contents?.size ?? 0
                document.root.contents?.reset(
                    to: ContentBase(node: root.id, version: root.version, size: root.size))
                var notices: [Notice] = [.inode(document.root.ino)]
                renew(document.root, &notices, keptSize: keptSize)
                return notices
            }
            send(notices)
            return
        }
        let records = try storeCall { try store.nodes(of: document.id, at: info.currentVersion) }
        let notices = state.withLock { state -> [Notice] in
            guard force || !(document.dirty || anyModified(document.root)) else { return [] }
            document.needsReload = false
            return apply(&state, document, records: records, version: info.currentVersion)
        }
        send(notices)
    }

    /// Whether a wrapper of the tree has bytes the store lacks. Scratch files are not counted:
    /// their bytes are never saved, and a reload keeps them, so an editor's swap file does not
    /// hold back another process's saves for as long as it stays open.
    private func anyModified(_ node: ViewNode) -> Bool {
        if node.contentsModified && !isScratch(node) { return true }
        return node.children.values.contains { anyModified($0) }
    }

    /// Shows `records` (the document at `version`) in the tree, keeping scratch files and nodes
    /// that are unchanged. Returns what the kernel must forget.
    private func apply(
        _ state: inout State, _ document: DocumentState, records: [NodeRecord], version: VersionID
    )
        -> [Notice]
    {
        var notices: [Notice] = []
        let old = document.committed ?? [:]
        var byID: [StoreNodeID: ViewNode] = [:]
        var scratch: [(parent: StoreNodeID, node: ViewNode)] = []
        func collect(_ node: ViewNode) {
            guard node.linked else { return }
            byID[node.persistAs] = node
            for child in node.children.values {
                if child.kind != .directory && configuration.scratchNames.matches(child.name) {
                    scratch.append((node.persistAs, child))
                } else {
                    collect(child)
                }
            }
        }
        collect(document.root)
        let parentIno: (ViewNode) -> UInt64 = { $0.parent?.ino ?? mountRootInode }
        var seen: Set<StoreNodeID> = []
        for record in records {
            seen.insert(record.id)
            if let node = byID[record.id], (node.linkOf == nil) != (record.linkOf == nil) {
                // A name that stopped (or started) being another name of a file: a new node.
                node.linked = false
                byID[record.id] = nil
            }
            if let node = byID[record.id] {
                let before = old[record.id]
                if before == nil || before?.version != record.version || !node.record.sameContent(as: record)
                {
                    // The root's name is the document's, which the root listing follows.
                    let keepName = node.atMountRoot ? node.name : FUSE.FileName(record.name)
                    if node.name != keepName || (node.parent?.persistAs != record.parent && !node.atMountRoot)
                    {
                        notices.append(.entry(parent: parentIno(node), name: node.name))
                    }
                    var updated = record
                    if node.atMountRoot { updated.name = node.record.name }
                    node.record = updated
                    node.name = keepName
                    if let contents = node.contents,
                        before?.version != record.version || contents.size != record.size
                    {
                        let keptSize = contents.size
                        contents.reset(
                            to: ContentBase(node: record.id, version: record.version, size: record.size))
                        renew(node, &notices, keptSize: keptSize)
                    }
                    notices.append(.inode(node.ino))
                }
            } else {
                let node = makeNode(
                    storeID: record.id, document: document.id, record: record,
                    name: FUSE.FileName(record.name))
                byID[record.id] = node
                if record.linkOf == nil { state.nodes[node.ino] = node }
            }
        }
        // Relink every saved node under its parent, then put scratch files back.
        for node in byID.values where !node.atMountRoot {
            node.children = node.children.filter { isScratch($0.value) }
        }
        document.root.children = document.root.children.filter { isScratch($0.value) }
        for record in records where record.id != document.info.root {
            guard let node = byID[record.id], let parentID = record.parent, let parent = byID[parentID] else {
                continue
            }
            if node.parent !== parent, let previous = node.parent { notices.append(.inode(previous.ino)) }
            node.parent = parent
            node.linked = true
            parent.children[node.name] = node
        }
        for (id, node) in byID where !seen.contains(id) {
            if let parent = node.parent {
                notices.append(
                    .delete(parent: parent.ino, child: (node.linkOf ?? node).ino, name: node.name))
                notices.append(.inode(parent.ino))
            }
            node.linked = false
            if node.linkOf == nil, node.openHandles == 0, table.node(for: node.ino) == nil {
                state.nodes[node.ino] = nil
            }
        }
        let before = byID.values.filter { $0.linkOf != nil || !$0.aliases.isEmpty }
        Self.joinLinks(records, byID)
        // Scratch names of files (never saved) are names all the same.
        for (_, node) in scratch where node.linked {
            if let file = node.linkOf { file.aliases[ObjectIdentifier(node)] = node }
        }
        // Files whose names changed show their new link counts.
        for node in before + byID.values.filter({ !$0.aliases.isEmpty }) {
            notices.append(.inode((node.linkOf ?? node).ino))
        }
        // Scratch files stayed among their folders' children: they stay there, linked, unless
        // their folder is gone or a saved wrapper took the name. (Taking "still there" for
        // "taken" unlinked every scratch file at every reload while it stayed listed: renamed
        // to a real name, as rsync and GIO publish theirs, it was never saved.)
        for (parentID, node) in scratch {
            let parent = byID[parentID]
            if let parent, seen.contains(parentID), parent.children[node.name].map({ $0 === node }) ?? true {
                parent.children[node.name] = node
            } else {
                if let parent, parent.children[node.name] === node { parent.children[node.name] = nil }
                node.linked = false
            }
        }
        var committed: [StoreNodeID: NodeRecord] = [:]
        for record in records { committed[record.id] = record }
        for record in records where old[record.id] == nil {
            guard let parent = record.parent.flatMap({ byID[$0] }) else { continue }
            notices.append(.inode(parent.ino))
            // The kernel may have cached the name as missing.
            notices.append(.entry(parent: parent.ino, name: FUSE.FileName(record.name)))
        }
        document.committed = committed
        document.base = version
        // What the mount still has that the store does not (after a conflict: changes to
        // wrappers the other save did not touch) is saved by the next save.
        document.touched = [:]
        for node in byID.values where node.linked {
            if node.contentsModified
                || !(committed[node.persistAs].map { node.record.sameContent(as: $0) } ?? false)
            {
                document.touched[ObjectIdentifier(node)] = node
                document.dirty = true
            }
        }
        return notices
    }

    /// Reads the root listing again and shows documents other processes created, renamed or
    /// deleted.
    func refreshListing() {
        // A listing taken while this mount creates, renames or deletes a document is stale
        // for that document: applying it would undo the change (the new name vanishes, the old
        // one comes back). Such a listing is dropped and taken again.
        // A listing that fails (a store that cannot be reached) is tried again a little later;
        // after that, the next event of a document this mount does not show lists again.
        var failures = 0
        for _ in 0..<8 {
            switch refreshListingOnce() {
            case .done: return
            case .stale:
                // This mount's own change is in flight, or ended while the listing was read:
                // it takes a store transaction's time.
                usleep(5_000)
                continue
            case .failed:
                failures += 1
                if failures == 3 { return }
                usleep(UInt32(failures) * 200_000)
            }
        }
        logger.warning("the store's listing kept changing under this mount's own changes; refreshed later")
    }

    private enum ListingRefresh { case done, stale, failed }

    /// One try of ``refreshListing()``: stale if this mount changed its documents meanwhile.
    private func refreshListingOnce() -> ListingRefresh {
        guard let generation = state.withLock({ $0.listed ? $0.rootGeneration : nil }) else { return .done }
        if state.withLock({ $0.rootChangesInFlight > 0 }) { return .stale }
        let infos: [DocumentInfo]
        do {
            infos = try store.documents().filter { !Self.isReservedAtRoot(FUSE.FileName($0.name)) }
        } catch {
            logger.warning("cannot list the store: \(error)")
            return .failed
        }
        let known = state.withLock { Set($0.documents.keys) }
        let roots: [DocumentID: NodeRecord]
        do {
            roots = try rootRecords(of: infos.filter { !known.contains($0.id) })
        } catch {
            logger.warning("cannot read the store's new documents: \(error)")
            return .failed
        }
        let conflicts = fetchConflicts(
            roots: Dictionary(infos.map { ($0.id, $0.root) }) { first, _ in first })
        let notices = state.withLock { state -> [Notice]? in
            guard state.rootGeneration == generation, state.rootChangesInFlight == 0 else { return nil }
            var notices: [Notice] = []
            let live = Dictionary(uniqueKeysWithValues: infos.map { ($0.id, $0) })
            for (id, document) in state.documents {
                guard let info = live[id] else {
                    // Deleted by someone else.
                    let node = document.root
                    if state.rootEntries[node.name] === node {
                        state.rootEntries[node.name] = nil
                        notices.append(.delete(parent: mountRootInode, child: node.ino, name: node.name))
                    }
                    node.linked = false
                    state.documents[id] = nil
                    continue
                }
                if info.name != document.info.name {
                    let node = document.root
                    let oldName = FUSE.FileName(document.info.name)
                    document.info.name = info.name
                    if state.rootEntries[oldName] === node {
                        state.rootEntries[oldName] = nil
                        notices.append(.entry(parent: mountRootInode, name: oldName))
                        let newName = FUSE.FileName(info.name)
                        if state.rootEntries[newName] == nil {
                            node.name = newName
                            node.record.name = info.name
                            state.rootEntries[newName] = node
                            notices.append(.entry(parent: mountRootInode, name: newName))
                        }
                    }
                }
            }
            for (id, record) in roots where state.documents[id] == nil {
                guard let info = live[id] else { continue }
                _ = install(&state, info: info, rootRecord: record)
                notices.append(.entry(parent: mountRootInode, name: FUSE.FileName(info.name)))
            }
            if let conflicts {
                notices += reconcileConflicts(
                    &state, versions: conflicts.versions, records: conflicts.records)
            }
            state.rootChanged = .now
            notices.append(.inode(mountRootInode))
            return notices
        }
        guard let notices else { return .stale }
        // Called on the observer's thread, never a request's: waiting is safe, and a name that
        // left the listing no longer resolves from the kernel's cache once this returns.
        send(notices, waitingUpTo: .seconds(2))
        return .done
    }
}
