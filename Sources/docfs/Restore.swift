import ArgumentParser
import DocumentEngine
import Foundation

/// `docfs restore [STORE] DOCUMENT VERSION` and `docfs restore [STORE] DOCUMENT --undelete`
struct Restore: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Restore a version of a document, or bring back a deleted document.",
        usage: """
            docfs restore [STORE] DOCUMENT VERSION
            docfs restore [STORE] DOCUMENT --undelete [--name NAME]
            """,
        discussion: """
            Restoring makes VERSION's wrappers and contents the document's current state as a \
            new save; the versions in between are kept. VERSION is an id from `docfs versions`.

            --undelete brings back a deleted document (see `docfs ls --deleted`), the most \
            recently deleted one of that name, as it was when it was deleted.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, the DOCUMENT, and the VERSION unless --undelete (see USAGE).",
            valueName: "store-document-version"))
    var arguments: [String] = []

    @Flag(help: "Bring back a deleted document instead of restoring a version.")
    var undelete = false

    @Option(help: "With --undelete: the name to give the document, when another has its name now.")
    var name: String?

    /// What the positional arguments name.
    func resolved() throws -> (store: String?, document: String, version: VersionID?) {
        if undelete {
            let (store, rest) = try Positionals.split(arguments, needs: ["DOCUMENT"])
            return (store, rest[0], nil)
        }
        let (store, rest) = try Positionals.split(arguments, needs: ["DOCUMENT", "VERSION"])
        guard let version = VersionArgument(argument: rest[1]) else {
            throw ValidationError("\(rest[1].debugDescription) is not a version; `docfs versions` lists them")
        }
        return (store, rest[0], version.id)
    }

    func validate() throws {
        if name != nil, !undelete { throw ValidationError("--name goes with --undelete") }
        _ = try resolved()
    }

    func run() async throws {
        let logger = global.bootstrap()
        let (storeArgument, documentName, version) = try resolved()
        let store = try StoreLocation(storeArgument).open(logger: logger)
        guard let version else {
            guard let deleted = try store.deletedDocuments().last(where: { $0.name == documentName }) else {
                throw Failure("no deleted document named \(documentName.debugDescription)")
            }
            let info = try store.undeleteDocument(deleted.id, as: name)
            print("undeleted \(info.name) (at version \(info.currentVersion.rawValue))")
            collectGarbageInBackground(store, logger: logger)
            return
        }
        let info = try liveDocument(named: documentName, in: store)
        // The store restores by version id; check that the id is this document's, so that a
        // typo cannot restore another document's tree into this one.
        guard try store.versions(of: info.id).contains(where: { $0.id == version }) else {
            throw DocumentStoreError.noSuchVersion(version)
        }
        let result = try store.restore(version, of: info.id, origin: "docfs restore")
        print(
            "restored \(info.name) to version \(version.rawValue) as version \(result.version.id.rawValue) "
                + "(\(result.bytesWritten) bytes written)")
        collectGarbageInBackground(store, logger: logger)
    }
}
