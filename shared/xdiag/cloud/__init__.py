"""Where the stages run: the Google Cloud adapters (Pub/Sub, Cloud Storage, Firestore) and the Cloud Functions
runtime, the embedded in-process default, and the local stack on the emulators."""
