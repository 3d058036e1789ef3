import ArgumentParser
import DocumentEngine
import Foundation

/// `docfs versions [STORE] DOCUMENT`
struct Versions: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "List a document's saved versions.",
        usage: "docfs versions [STORE] DOCUMENT",
        discussion: """
            One line per version, oldest first: "*" marks the current one, then its id, when it \
            was saved, the version it was based on, the content bytes the save wrote, its state \
            (conflict: a save kept beside the current version; resolved: a conflict someone \
            resolved) and who saved it.

            DOCUMENT may also be a deleted document (see `docfs ls --deleted`); the most \
            recently deleted one of that name is shown.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, then the DOCUMENT (see USAGE).", valueName: "store-and-document"))
    var arguments: [String] = []

    func validate() throws {
        _ = try Positionals.split(arguments, needs: ["DOCUMENT"])
    }

    func run() async throws {
        let logger = global.bootstrap()
        let (storeArgument, rest) = try Positionals.split(arguments, needs: ["DOCUMENT"])
        let store = try StoreLocation(storeArgument).open(logger: logger)
        let name = rest[0]
        let info: DocumentInfo
        if let live = try store.document(named: name) {
            info = live
        } else if let deleted = try store.deletedDocuments().last(where: { $0.name == name }) {
            info = deleted
            FileHandle.standardError.write(
                Data("\(name) is deleted; `docfs restore --undelete` brings it back\n".utf8))
        } else {
            throw DocumentStoreError.noSuchDocument(name)
        }
        let rows = try store.versions(of: info.id).map { version -> [String] in
            let state = version.isConflict ? (version.isResolved ? "resolved" : "conflict") : "-"
            return [
                version.id == info.currentVersion ? "*" : " ", "\(version.id.rawValue)",
                Format.time(version.created), version.base.map { "\($0.rawValue)" } ?? "-",
                "\(version.bytesWritten)", state, version.origin.isEmpty ? "-" : version.origin,
            ]
        }
        let header = [" ", "VERSION", "SAVED", "BASE", "WRITTEN", "STATE", "ORIGIN"]
        for line in Format.table([header] + rows, rightAligned: [1, 3, 4]) { print(line) }
    }
}
