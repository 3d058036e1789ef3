import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// Renames within a package and at the mount root (`rename(2)` and `renameat2(2)` in every form);
/// moves between the root and a package are in NameOperations+Moves.swift.
extension NameOperations {
    /// `rename(2)` and `renameat2(2)`, in every form.
    func rename(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, newParent: NodeID,
        newName: FUSE.FileName, flags: RenameFlags
    ) throws(Errno) {
        guard !configuration.readOnly else { throw .readOnlyFileSystem }
        guard !flags.contains(.whiteout), flags != [.noReplace, .exchange] else { throw .invalidArgument }
        try checkLength(name)
        let newText = try validate(newName)
        if (parent == .root && Self.isReservedAtRoot(name))
            || (newParent == .root && Self.isReservedAtRoot(newName))
        {
            throw .permissionDenied
        }
        let from = parent == .root ? nil : try resolver.resolve(parent, loadingChildren: true)
        let to = newParent == .root ? nil : try resolver.resolve(newParent, loadingChildren: true)
        if parent != .root && newParent != .root && !desktop.isVirtual(from) && !desktop.isVirtual(to) {
            try renameInPackage(parent, name, newParent, newName, newText, flags: flags)
        } else {
            // The root's names, the Trash and moves to or from the root change the root's
            // documents; renames in packages do not, and leave a listing refresh alone.
            try changingRoot { () throws(Errno) in
                if try desktop.renameVirtual(from, name, to, newName, newText, flags: flags) { return }
                if parent == .root && newParent == .root {
                    try renameAtRoot(name, newName, newText, flags: flags)
                } else {
                    try moveAcross(parent, name, newParent, newName, newText, flags: flags)
                }
            }
        }
    }

    func renameInPackage(
        _ parent: NodeID, _ name: FUSE.FileName, _ newParent: NodeID, _ newName: FUSE.FileName,
        _ newText: String,
        flags: RenameFlags
    ) throws(Errno) {
        guard let from = try resolver.resolve(parent, loadingChildren: true),
            let to = try resolver.resolve(newParent, loadingChildren: true)
        else { throw .noSuchFileOrDirectory }
        let across = state.withLock { _ in
            from.document != to.document && from.conflict == nil && to.conflict == nil
        }
        if across {
            try moveAcross(parent, name, newParent, newName, newText, flags: flags)
            return
        }
        // A file renamed onto a property list shown as text publishes its text: refuse text that
        // does not compile before anything moves.
        if configuration.archivesAsText {
            let incoming = state.withLock { _ -> (ViewNode, Bool)? in
                guard let node = from.children[name], node.kind == .regularFile, !flags.contains(.exchange),
                    let kind = to.children[newName]?.contents?.propertyList, let contents = node.contents
                else { return nil }
                let marked = contents.propertyList == nil
                if marked {
                    contents.propertyList = kind
                    contents.replaces = to.children[newName]?.contents.flatMap { $0.base.text ?? $0.replaces }
                }
                return (node, marked)
            }
            if let (node, marked) = incoming {
                do { try texts.checkText(node) } catch {
                    if marked {
                        state.withLock { _ in
                            node.contents?.propertyList = nil
                            node.contents?.replaces = nil
                        }
                    }
                    throw error
                }
            }
        }
        let saveDocument = try state.withLock { state throws(Errno) -> DocumentState? in
            guard from.document != nil, from.document == to.document else { throw .improperLink }
            guard let node = from.children[name] else { throw .noSuchFileOrDirectory }
            let target = to.children[newName]
            // Two names of one file: POSIX leaves both as they are.
            if let target, (target.linkOf ?? target) === (node.linkOf ?? node) { return nil }
            if node.kind == .directory && to.isDescendant(of: node) { throw .invalidArgument }
            if flags.contains(.noReplace) && target != nil { throw .fileExists }
            if flags.contains(.exchange) {
                guard let target else { throw .noSuchFileOrDirectory }
                if target.kind == .directory && from.isDescendant(of: target) { throw .invalidArgument }
                from.children[name] = target
                to.children[newName] = node
                (node.name, target.name) = (newName, name)
                (node.parent, target.parent) = (to, from)
                node.record.name = newText
                target.record.name = name.string
                node.record.parent = to.persistAs
                target.record.parent = from.persistAs
                let now = Timestamp.now
                for n in [node, target, from, to] { n.record.changed = now }
                from.record.modified = now
                to.record.modified = now
                for n in [node, target, from, to] { changed(&state, n) }
                return self.document(&state, of: node)
            }
            try checkNoEquivalent(newText, in: to.children, except: target)
            if let target {
                try checkReplaceable(target, by: node.kind)
                unlinkName(&state, target)
            }
            if node.linkOf == nil, configuration.scratchNames.matches(newName), isPersisted(node),
                let heir = heir(of: node), isPersisted(heir), let place = heir.parent
            {
                // A file with other names going to a scratch name (a backup, say) stays saved
                // under another name: its node takes that name's place, and the scratch name
                // becomes the other name, which is never saved.
                let now = Timestamp.now
                from.children[name] = nil
                (node.name, heir.name) = (heir.name, newName)
                (node.parent, heir.parent) = (place, to)
                node.record.name = heir.record.name
                node.record.parent = place.persistAs
                heir.record.name = newText
                heir.record.parent = to.persistAs
                place.children[node.name] = node
                to.children[newName] = heir
                for n in [node, heir, from, to, place] { n.record.changed = now }
                for n in [from, to, place] { n.record.modified = now }
                for n in [node, heir, from, to, place] { changed(&state, n) }
                return nil
            }
            let wasScratch = !isPersisted(node)
            texts.noteLeaving(&state, node, name: name, directory: from)
            if let replaced = target?.contents, let kind = replaced.propertyList, node.kind == .regularFile,
                let contents = node.contents, contents.propertyList == nil
            {
                contents.propertyList = kind
                contents.replaces = replaced.base.text ?? replaced.replaces
            }
            from.children[name] = nil
            to.children[newName] = node
            node.name = newName
            node.parent = to
            node.record.name = newText
            node.record.parent = to.persistAs
            let now = Timestamp.now
            node.record.changed = now
            from.record.modified = now
            from.record.changed = now
            to.record.modified = now
            to.record.changed = now
            changed(&state, node)
            if !wasScratch || isPersisted(node) {
                changed(&state, from)
                changed(&state, to)
            }
            // A rename onto a wrapper's name (or publishing a scratch file) is a save point,
            // committed as a close's is: a safe-save's `fsyncdir` follows at once, and logs it.
            guard isPersisted(node), target != nil || wasScratch else { return nil }
            return self.document(&state, of: node)
        }
        if let saveDocument { saving.commitSoon(saveDocument) }
    }

    func renameAtRoot(_ name: FUSE.FileName, _ newName: FUSE.FileName, _ newText: String, flags: RenameFlags)
        throws(Errno)
    {
        try ensureListing()
        enum Plan {
            case done
            case save(DocumentState)
            case renameDocument(DocumentState, replacing: DocumentState?)
            case exchangeDocuments(DocumentState, DocumentState)
            case createDocument(ViewNode)
            case keepConflict(ConflictEntry, DocumentState)
            case copyConflict(ConflictEntry, replacing: DocumentState?)
        }
        let plan = try state.withLock { state throws(Errno) -> Plan in
            guard let node = state.rootEntries[name] else { throw .noSuchFileOrDirectory }
            let target = state.rootEntries[newName]
            if target === node { return .done }
            if let target, target.conflict != nil { throw .notPermitted }
            if let entry = conflictEntry(&state, of: node) {
                // Onto its own document: keep that version. Anywhere else: keep both, as a new
                // document of that name.
                if flags.contains(.exchange) { throw .improperLink }
                if let target {
                    if node.kind != target.kind {
                        throw node.kind == .directory ? .notDirectory : .isDirectory
                    }
                    if let document = state.documents[entry.version.document], document.root === target,
                        !isHidden(target, of: document)
                    {
                        guard flags.isEmpty else { throw .fileExists }
                        return .keepConflict(entry, document)
                    }
                    if flags.contains(.noReplace) { throw .fileExists }
                    if target.kind == .directory && !target.children.isEmpty { throw .directoryNotEmpty }
                }
                let replaced = target.flatMap { self.document(&state, of: $0) }.flatMap {
                    isHidden($0.root, of: $0) ? nil : $0
                }
                if let target, replaced == nil { detach(&state, target) }
                return .copyConflict(entry, replacing: replaced)
            }
            if flags.contains(.noReplace) && target != nil { throw .fileExists }
            let scratchTarget = configuration.scratchNames.matches(newName)
            let document = self.document(&state, of: node)
            let targetDocument = target.flatMap { self.document(&state, of: $0) }
            if flags.contains(.exchange) {
                guard let target else { throw .noSuchFileOrDirectory }
                if let document, let targetDocument, !isHidden(node, of: document),
                    !isHidden(target, of: targetDocument)
                {
                    return .exchangeDocuments(document, targetDocument)
                }
                guard document == nil && targetDocument == nil else { throw .invalidArgument }
                state.rootEntries[name] = target
                state.rootEntries[newName] = node
                (node.name, target.name) = (newName, name)
                return .done
            }
            if let target { try checkReplaceable(target, by: node.kind) }
            if let document, !isHidden(node, of: document) {
                if node.kind == .regularFile && scratchTarget {
                    // vim's backup (`name~`): the document stays in the store under its name
                    // until a new file of that name is saved; the mount shows it as scratch.
                    if let target { detach(&state, target) }
                    state.rootEntries[name] = nil
                    state.rootEntries[newName] = node
                    node.name = newName
                    state.rootChanged = .now
                    return .done
                }
                return .renameDocument(document, replacing: targetDocument)
            }
            // A scratch file (or a hidden document) at the root.
            if scratchTarget {
                if let target { detach(&state, target) }
                state.rootEntries[name] = nil
                state.rootEntries[newName] = node
                node.name = newName
                if let document, node.name.string == document.info.name { changed(&state, node) }
                state.rootChanged = .now
                return .done
            }
            guard node.kind == .regularFile else { throw .notPermitted }
            // Publishing: the file becomes the document of that name, a new one if none.
            let existing =
                targetDocument
                ?? state.documents.values.first(where: { $0.info.name == newText && $0.info.kind == .flat })
            state.rootEntries[name] = nil
            if let target { detach(&state, target) }
            if let existing {
                if let document, document !== existing {
                    // A hidden document's node published under another document's name.
                    document.root = makeNode(
                        storeID: document.info.root, document: document.id,
                        record: node.record, name: FUSE.FileName(document.info.name))
                }
                node.contents?.base = node.contents?.base ?? .empty(node.storeID)
                adopt(&state, existing, node)
                return .save(existing)
            }
            if let document {
                // A hidden document's node published under a new name: the document keeps a
                // node of its own, and stays in the store under its name.
                document.root = makeNode(
                    storeID: document.info.root, document: document.id, record: node.record,
                    name: FUSE.FileName(document.info.name))
            }
            node.name = newName
            return .createDocument(node)
        }
        switch plan {
        case .done:
            return
        case .keepConflict(let entry, let document):
            try conflictCopies.keepConflict(entry, as: document)
        case .copyConflict(let entry, let replaced):
            try conflictCopies.copyConflict(entry, as: newName, newText, replacing: replaced)
        case .save(let document):
            try saving.save(document, durable: false)
        case .renameDocument(let document, let replaced):
            // Replacing is one transaction: a crash leaves the old document under the name, or
            // the renamed one, never neither (rename(2) is atomic).
            replaced?.saving.lock()
            defer { replaced?.saving.unlock() }
            let info = try storeCall {
                try store.transaction(durable: false) { tx -> DocumentInfo in
                    if let replaced { try tx.deleteDocument(replaced.id, origin: origin) }
                    return try tx.renameDocument(document.id, to: newText)
                }
            }
            state.withLock { state in
                if let replaced {
                    replaced.dirty = false
                    detach(&state, replaced.root)
                    state.documents[replaced.id] = nil
                }
                if state.rootEntries[name] === document.root { state.rootEntries[name] = nil }
                document.info = info
                document.namesUnsynced = true
                document.root.name = newName
                document.root.record.name = newText
                state.rootEntries[newName] = document.root
                state.rootChanged = .now
            }
        case .exchangeDocuments(let a, let b):
            let (aInfo, bInfo) = try storeCall {
                try store.transaction(durable: false) { tx in try tx.exchangeDocuments(a.id, b.id) }
            }
            state.withLock { state in
                a.info = aInfo
                b.info = bInfo
                a.namesUnsynced = true
                b.namesUnsynced = true
                (a.root.name, b.root.name) = (FUSE.FileName(aInfo.name), FUSE.FileName(bInfo.name))
                a.root.record.name = aInfo.name
                b.root.record.name = bInfo.name
                state.rootEntries[a.root.name] = a.root
                state.rootEntries[b.root.name] = b.root
                state.rootChanged = .now
            }
        case .createDocument(let node):
            try publishAsDocument(node, from: name, as: newName, newText)
        }
    }

    /// Publishes the file `node` (a scratch file renamed from `name`) as a new flat document
    /// named `newText`: the document and its contents are one store transaction, so a crash
    /// leaves the file under neither name or under the new one with all of its bytes.
    private func publishAsDocument(
        _ node: ViewNode, from name: FUSE.FileName, as newName: FUSE.FileName, _ newText: String
    ) throws(Errno) {
        let frozen = state.withLock { _ -> (record: NodeRecord, change: SavePipeline.ContentChange?) in
            var record = node.record
            record.parent = nil
            record.name = newText
            record.linkOf = nil
            let change = saving.contentChange(node, &record, stored: nil)
            return (record, change)
        }
        var record = frozen.record
        if frozen.change?.held == true {
            // Text that does not compile as the property list it stands for.
            state.withLock { state in
                node.name = name
                if state.rootEntries[name] == nil { state.rootEntries[name] = node }
            }
            throw .invalidArgument
        }
        // The new document's file is a node of its own (the scratch file's may be another
        // document's); its bytes are cut and hashed before the transaction.
        let rootID = try newStoreID()
        var contents: PreparedChanges?
        if let update = frozen.change?.update {
            var changes = DocumentChanges(document: DocumentID(rawValue: 0), base: VersionID(rawValue: 0))
            changes.contents[rootID] = update
            do { contents = try storeCall { try store.prepare(changes) } } catch {
                state.withLock { state in
                    if let snapshot = frozen.change?.snapshot { node.contents(for: snapshot)?.saveFailed() }
                    node.name = name
                    if state.rootEntries[name] == nil { state.rootEntries[name] = node }
                }
                throw error
            }
        }
        let saved: (info: DocumentInfo, root: NodeRecord?)
        do {
            saved = try storeCall {
                try store.transaction(durable: false) { tx -> (DocumentInfo, NodeRecord?) in
                    // The document, with the file's attributes and bytes, as one version.
                    let info = try tx.createDocument(
                        named: newText,
                        root: DocumentRoot(
                            kind: .regularFile, permissions: record.permissions, uid: record.uid,
                            gid: record.gid, node: rootID),
                        type: nil, origin: origin, contents: contents)
                    return (info, try tx.node(info.root))
                }
            }
        } catch {
            // Put the file back where it was, its writes still to be saved.
            state.withLock { state in
                if let snapshot = frozen.change?.snapshot { node.contents(for: snapshot)?.saveFailed() }
                node.name = name
                if state.rootEntries[name] == nil { state.rootEntries[name] = node }
            }
            throw error
        }
        state.withLock { state in
            let info = saved.info
            record.id = info.root
            record.document = info.id
            record.version = info.currentVersion
            let document = DocumentState(info: info, root: node)
            // The store's record, with the times it gave the new file; the node keeps its own.
            document.committed = [info.root: saved.root ?? record]
            document.base = info.currentVersion
            document.namesUnsynced = true
            state.documents[info.id] = document
            adopt(&state, document, node)
            // Everything adopting marked as changed is in the store already.
            document.touched = [:]
            document.dirty = false
            if let change = frozen.change, let snapshot = change.snapshot,
                let contents = node.contents(for: snapshot)
            {
                contents.saved(snapshot, as: info.root, version: info.currentVersion, text: change.text)
            }
        }
    }
}
