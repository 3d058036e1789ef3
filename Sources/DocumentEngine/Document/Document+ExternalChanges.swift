import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Changes made by other processes while a document is open: the polling that notices them,
/// the reload, and the conflict version that keeps unsaved changes when both sides changed.
extension Document {
    // MARK: Changes by other processes (UD-32, UD-35, FV-*)

    func startMonitoring() {
        OpenDocuments.shared.add(self)
        monitorTask?.cancel()
        let clock = self.clock
        let interval = monitoringInterval
        monitorTask = Task { [weak self] in
            while !Task.isCancelled {
                do { try await clock.sleep(for: interval) } catch { return }
                guard let self else { return }
                await self.checkForExternalChanges()
            }
        }
    }

    /// Looks for a change another process made since the last open, save or revert, and reloads
    /// (editing disabled meanwhile; observers told through ``contentsDidUpdateNotification``,
    /// ``contentsUpdates`` and ``documentContentsDidUpdate()``).
    ///
    /// With unsaved changes, the newer save wins as iCloud does: the document's own contents are
    /// first kept as an unresolved conflict version (``unresolvedConflictVersions()``), then it
    /// reloads and enters `inConflict`; nothing is lost. Returns whether a change was found.
    @discardableResult
    public func checkForExternalChanges() async -> Bool {
        guard !documentState.contains(.closed), !isSaving, !isOpening, !isClosing else { return false }
        let location = self.location
        let storeVersion = shared.withLock { $0.storeVersion }
        let changed: Bool = await fileAccess.run { [lastSignature] in
            switch location {
            case .file(let url): return DiskSignature(of: url) != lastSignature
            case .store(let store, let name):
                guard let info = try? store.document(named: name) else { return false }
                return info.currentVersion != storeVersion
            }
        }
        guard changed, !isSaving, !isOpening else { return false }
        var conflict = false
        if hasUnsavedChanges {
            conflict = await keepOwnVersionAsConflict()
            guard conflict else { return true }  // could not keep our version: do not reload over it
        }
        insertState(.editingDisabled)
        disableEditing()
        let reverted = await revert(toContentsOf: fileURL)
        if conflict { insertState(.inConflict) }
        if reverted {
            documentContentsDidUpdate()
            NotificationCenter.default.post(name: Self.contentsDidUpdateNotification, object: self)
            for continuation in updateContinuations.values { continuation.yield() }
        }
        return true
    }

    /// Keeps the in-memory contents as an unresolved conflict version; false if that failed.
    private func keepOwnVersionAsConflict() async -> Bool {
        let contents: Any
        do { contents = try self.contents(forType: savingFileType ?? fileType ?? "public.data") } catch {
            handleError(error, userInteractionPermitted: false)
            return false
        }
        let box = ContentsBox(contents)
        let location = self.location
        let (documentID, base) = shared.withLock { ($0.storeDocument, $0.storeVersion) }
        do {
            try await fileAccess.run {
                switch location {
                case .file(let url):
                    _ = try DocumentVersionStore(for: url).keep(
                        box.contents, named: url.lastPathComponent, asConflict: true)
                case .store(let store, _):
                    guard let documentID, let base else {
                        throw DocumentStoreError.noSuchDocument(location.url.lastPathComponent)
                    }
                    let wrapper =
                        (box.contents as? FileWrapper)
                        ?? FileWrapper(regularFileWithContents: box.contents as? Data ?? Data())
                    // Based on the version we had, so the store keeps it beside theirs.
                    _ = try store.save(
                        wrapper, to: documentID, base: base, origin: "document \(getpid()) (conflict)",
                        conflictPolicy: .keepBoth)
                }
            }
            return true
        } catch {
            Self.logger.error(
                "could not keep the unsaved version of \(fileURL.path): \(String(describing: error))")
            handleError(error, userInteractionPermitted: false)
            return false
        }
    }

    // MARK: Conflict versions (FV-1..FV-5)

    /// The unresolved conflict versions of this document (FV-1); `inConflict` ⇔ not empty (UD-8).
    public func unresolvedConflictVersions() async -> [DocumentVersion] {
        let location = self.location
        return await fileAccess.run { DocumentVersion.unresolvedConflictVersions(of: location) }
    }

    /// Recomputes `inConflict` from the unresolved conflict versions (UD-8, FV-5 step 5).
    public func updateConflictState() async {
        if await unresolvedConflictVersions().isEmpty {
            removeState(.inConflict)
        } else {
            insertState(.inConflict)
        }
    }
}
