"""The chat prompts the model answers for its own calibration text (engine/quant/calibration.py).

Varied on purpose: stories, explanations, letters, dialogue, instructions, opinion, news,
poems, reasoning, a little code. Each prompt is one user turn, rendered through the model's
chat template; the answers are sampled from the model being quantized, so the calibration
activations follow what the model itself produces in many registers, not one domain.

NOTE: the held-out texts of benchmarks/heldout/ must stay unseen: no prompt here may ask for
their topics or quote them (a lighthouse keeper, walking in cities, a village bakery, a
letter to a friend who moves away, soil life, a touring comedy, a river that recovers).
"""

from __future__ import annotations

PROMPTS = (
    # stories and scenes
    "Write a short story about a girl who finds a key that opens every door in her school.",
    "Tell a story about an old clockmaker and the last clock he ever built.",
    "Write a scene in which two strangers share an umbrella at a bus stop.",
    "Write a fable about a fox, a crow and a drought.",
    "Describe a market in a desert town at sunrise, as a novelist would.",
    "Write the opening of a mystery novel set on a night train across the mountains.",
    "Tell a bedtime story about a small dragon who is afraid of the dark.",
    "Write a story about a farmer who grows a pumpkin the size of a house.",
    "Describe a thunderstorm from the point of view of a cat hiding under a bed.",
    "Write a short science fiction story about the first family to live on Mars.",
    "Write a ghost story that takes place in an empty school during the holidays.",
    "Tell the story of a soldier walking home at the end of a long war.",
    # explanations: science, nature, technology
    "Explain how vaccines train the immune system, for a high school student.",
    "Why is the sky blue? Explain it simply and then in more detail.",
    "Explain how a bill becomes a law in a parliament.",
    "How do bees make honey, and why do they need so much of it?",
    "Explain what inflation is and why prices rise over time.",
    "How does a refrigerator keep food cold?",
    "Describe the water cycle and the role of clouds in it.",
    "What causes earthquakes, and why are some places hit more often than others?",
    "Explain the difference between weather and climate.",
    "How do airplanes stay in the air?",
    "Explain photosynthesis to a ten-year-old.",
    "What is a black hole, and how do astronomers find one?",
    "How does the human heart pump blood around the body?",
    "Explain how the internet sends a message from one computer to another.",
    "Why do we dream? Summarize what scientists think.",
    "Explain how coral reefs form and why they are in danger.",
    # history and society
    "Describe daily life in a medieval castle.",
    "Give a short history of the printing press and its effect on Europe.",
    "What was the Silk Road, and what travelled along it besides silk?",
    "Describe how the ancient Egyptians built the pyramids, as far as we know.",
    "Write a short biography of an imaginary nineteenth-century explorer of the Arctic.",
    "Why did the Roman Empire fall? Give several reasons historians discuss.",
    "Describe the role of railways in the industrial revolution.",
    "How did people keep food fresh before refrigerators existed?",
    # practical writing: letters, emails, notices
    "Write a polite email to a landlord asking for a broken heater to be repaired.",
    "Write a cover letter for a job as a librarian.",
    "Write a thank-you note to a teacher who helped you through a difficult year.",
    "Write a complaint to an airline about lost luggage, firm but polite.",
    "Write a notice for a community board announcing a neighborhood clean-up day.",
    "Write an email to your team announcing that a project deadline has moved.",
    "Write a wedding toast for your older sister.",
    "Write a letter of apology to a neighbor whose window your football broke.",
    # instructions and advice
    "How do I make a simple vegetable soup? Give step-by-step instructions.",
    "Give me advice for my first week at a new job.",
    "How can I get better at public speaking?",
    "Explain how to change a flat tire on a bicycle.",
    "What are some good habits for getting better sleep?",
    "How should I prepare for a long hike in the mountains?",
    "Give tips for learning a new language as an adult.",
    "How do I start a small vegetable patch on a balcony?",
    "What should I consider before adopting a dog?",
    "How can I save money on groceries each month?",
    "Give me a plan to train for my first five-kilometer run.",
    # opinion, argument, reflection
    "Should schools start later in the morning? Argue both sides.",
    "Write a short essay on why people enjoy being afraid in horror films.",
    "Is it better to live in the countryside or in a big city? Discuss.",
    "Write an essay about what makes a good friend.",
    "What are the benefits and drawbacks of working from home?",
    "Write a persuasive paragraph encouraging people to read more books.",
    "Reflect on the value of boredom in a busy life.",
    "Should museums return objects taken from other countries? Discuss fairly.",
    # news, reviews, descriptions
    "Write a news report about a town that wins a national award for its public gardens.",
    "Write a product description for a waterproof hiking backpack.",
    "Write a review of an imaginary Italian restaurant that just opened downtown.",
    "Write a weather forecast for a stormy weekend on the coast.",
    "Write a short report on a school science fair.",
    "Describe a football match in the style of a radio commentator.",
    "Write a travel guide entry for an imaginary island in the Pacific.",
    "Summarize the plot of a classic adventure novel of your choice.",
    # dialogue and role play
    "Write a conversation between a customer and a shop assistant about returning a jacket.",
    "Write a dialogue between a grandmother and her grandson about her first phone.",
    "Pretend you are a tour guide in Rome and welcome a group of visitors.",
    "Write an interview with a famous chef about her childhood.",
    "Role-play a doctor explaining to a patient why rest matters after a sprained ankle.",
    "Write a job interview between a manager and a nervous young applicant.",
    "Write a phone call between two old friends planning a reunion.",
    # poems and songs
    "Write a poem about the first snow of winter.",
    "Write a short poem about a city at night.",
    "Write a song about sailing home across a calm sea.",
    "Write a limerick about a forgetful professor.",
    "Write a poem about an old tree in a schoolyard.",
    # reasoning, math, puzzles
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey? Show your reasoning.",
    "If three notebooks cost 4.50, how much do seven cost? Explain step by step.",
    "Explain the Monty Hall problem and why switching doors helps.",
    "What is the difference between a mean, a median and a mode? Give examples.",
    "Solve: a rectangle is twice as long as it is wide and its perimeter is 36 cm. Find its area.",
    "Explain what a prime number is and list the primes below fifty.",
    "A shop cuts a price by 20% and then raises it by 20%. Is it back where it started?",
    # a little code
    "Write a Python function that checks whether a word is a palindrome, and explain it.",
    "Explain what a for loop is, with a short example in Python.",
    "Write a SQL query that lists the ten customers with the highest total orders.",
    "Explain the difference between a list and a dictionary in Python.",
    "Write a short JavaScript function that counts the vowels in a string.",
)
